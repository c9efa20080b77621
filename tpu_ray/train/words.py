"""Where words start, from the tokenizer's own vocabulary: the table whole-word masking reads.

Why from the vocabulary and not from the text: masking runs on token ids inside tf.data, so the
word boundary must be a property of each id. Tokenizers mark it in the piece itself: WordPiece
writes continuations as `##piece`; SentencePiece/Metaspace (Unigram, tpu-ray's BPE) and
byte-level BPE (RoBERTa, GPT-2) write word starts as `▁piece` / `Ġpiece`. A vocabulary with
`##` pieces is WordPiece; otherwise the prefix that marks starts is the one its pieces use.
Special and added tokens always start a word.

The same table sizes the predictions bound whole-word masking needs (sampled_word_bound): a
corpus of long words (a space-free CJK line under Metaspace is one word) needs more than BERT's.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from tpu_ray.errors import UserError

if TYPE_CHECKING:
    from tpu_ray.config import RunPaths
    from tpu_ray.prepare.tokenizer import TokenizerInfo

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


_WORD_BOUNDS: dict[tuple, int] = {}


def sampled_word_bound(paths: RunPaths, mask_prob: float, words: tuple[bool, ...], tok: TokenizerInfo,
                       span: Any = None, rows_per_file: int = 64, max_files: int = 16) -> int:
    """inputs.whole_word_bound over a sample of the train shards (`rows_per_file` rows of up to
    `max_files` files spread over the split), measured once per shard set and masking rate.
    `span`: a phase (train/phases.Span: its length's shards and its rate); None: the run's own
    (shard.seq_len's set, `mask_prob`: train.mask_prob)."""
    import numpy as np
    import tensorflow as tf

    from tpu_ray.prepare.shard_set import ShardSet
    from tpu_ray.train.inputs import parse_batch, whole_word_bound

    seq_len = paths.seq_len if span is None else span.seq_len
    mask_prob = mask_prob if span is None else span.mask_prob
    where = paths.shards_at(seq_len)
    try:  # training opened and checked them already; a doctor's program check may have none here
        files = sorted(ShardSet.open(where).files("train"))
    except (UserError, OSError):
        return 0
    key = (where, tuple(files), mask_prob, seq_len)
    if key not in _WORD_BOUNDS:
        picked = [f for f, _ in files[:: max(1, len(files) // max_files)]][:max_files]
        rows = []
        for f in picked:
            for serialized in tf.data.TFRecordDataset(f).batch(rows_per_file).take(1):
                rows.append(parse_batch(serialized, seq_len)["input_ids"].numpy())
        sample = np.concatenate(rows) if rows else np.zeros((0, seq_len), np.int32)
        never = tuple(i for i in tok.special_ids if i != tok.unk_id)
        _WORD_BOUNDS[key] = whole_word_bound(sample, words, mask_prob, never)
    return _WORD_BOUNDS[key]
