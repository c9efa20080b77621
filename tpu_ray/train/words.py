"""Where words start, from the tokenizer's own vocabulary: the table whole-word masking reads.

Why from the vocabulary and not from the text: masking runs on token ids inside tf.data, so the
word boundary must be a property of each id. Tokenizers mark it in the piece itself: WordPiece
writes continuations as `##piece`; SentencePiece/Metaspace (Unigram, tpu-ray's BPE) and
byte-level BPE (RoBERTa, GPT-2) write word starts as `▁piece` / `Ġpiece`. A vocabulary with
`##` pieces is WordPiece; otherwise the prefix that marks starts is the one its pieces use.
Special and added tokens always start a word.
"""

from __future__ import annotations

import json

METASPACE, BYTE_LEVEL, WORDPIECE = "\u2581", "\u0120", "##"


def continuation_table(tokenizer_json: str) -> tuple[bool, ...]:
    """Per id: True when the token continues the word before it."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    vocab = tok.get_vocab(with_added_tokens=True)
    size = tok.get_vocab_size(with_added_tokens=True)
    added = {t["id"] for t in json.loads(tokenizer_json).get("added_tokens", [])}
    pieces = [""] * size
    for piece, i in vocab.items():
        if 0 <= i < size:
            pieces[i] = piece
    if any(p.startswith(WORDPIECE) for p in pieces):
        table = [p.startswith(WORDPIECE) for p in pieces]
    else:
        start = METASPACE if sum(p.startswith(METASPACE) for p in pieces) >= sum(
            p.startswith(BYTE_LEVEL) for p in pieces) else BYTE_LEVEL
        table = [bool(p) and not p.startswith(start) for p in pieces]
    return tuple(c and i not in added for i, c in enumerate(table))
