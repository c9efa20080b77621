"""Token classification (a label per word, NER-style): words to subword tokens and back.

The labels are per word and the model predicts per subword token, so they are aligned as Hugging
Face's run_ner.py does: the first subword of each word carries the word's label, the word's other
subwords and the special tokens get IGNORE (-100), which transformers' token-classification loss
leaves out. A prediction is read back from each word's first subword; a word truncated away by
max_length gets the task's outside label, so it is scored as missed, never dropped from the score.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IGNORE = -100  # transformers' TFTokenClassificationLoss skips this label


def align_labels(word_ids: Sequence[int | None], labels: Sequence[int]) -> list[int]:
    """Per-token labels: a word's label on its first subword, IGNORE on the rest and on special tokens."""
    out, previous = [], None
    for w in word_ids:
        out.append(IGNORE if w is None or w == previous else labels[w])
        previous = w
    return out


def word_predictions(word_ids: Sequence[int | None], token_preds: Sequence[int], n_words: int,
                     fill: int) -> list[int]:
    """Per-word predictions from each word's first subword; `fill` for words with no token left."""
    out = [fill] * n_words
    previous = None
    for w, p in zip(word_ids, token_preds):
        if w is not None and w != previous:
            out[w] = int(p)
        previous = w
    return out


def outside_label(names: Sequence[str]) -> int:
    """The label a missed word gets: `O` (the IOB outside tag) where the task has it, else class 0."""
    return list(names).index("O") if "O" in names else 0


def encode_words(tok: Any, rows: list[dict], max_length: int, type_vocab: int) -> tuple[dict[str, Any], Any,
                                                                                           list[list[int | None]]]:
    """(model inputs, aligned labels [n, max_length], each row's word ids) of rows {text: [words], label: [ids]}.

    Needs a fast tokenizer (its `word_ids`), as every tokenizer tpu-ray trains is.
    """
    import numpy as np

    if not getattr(tok, "is_fast", False):
        raise ValueError(f"token classification needs a fast tokenizer (word ids); {type(tok).__name__} is not")
    enc = tok([r["text"] for r in rows], is_split_into_words=True, truncation=True, max_length=max_length,
              padding="max_length", return_tensors="np")
    word_ids = [enc.word_ids(i) for i in range(len(rows))]
    y = np.asarray([align_labels(ids, r["label"]) for ids, r in zip(word_ids, rows)], dtype=np.int32)
    keep = ["input_ids", "attention_mask"] + (["token_type_ids"] if type_vocab > 1 else [])
    return {k: enc[k] for k in keep if k in enc}, y, word_ids
