"""Bits per byte divides by the text's own UTF-8 bytes, for every tokenizer kind.

Before, the bytes came from the vocabulary (a piece's characters, `▁`/`Ġ` as one space): a
WordPiece tokenizer drops the spaces between words, so "hello, world" counted 11 bytes of 12 and a
WordPiece run reported 27% more bits per byte than a BPE run of equal loss. Tiny real tokenizers
of the four kinds are trained here; each one's per-token bytes must sum to a direct byte count.
"""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from tpu_ray.config import TokenizerConfig
from tpu_ray.prepare.shards import encode_joined_with_bytes, encode_lines_with_bytes
from tpu_ray.prepare.tokenizer import train_tokenizer

CORPUS = ["hello, world", "The quick brown fox jumps over the lazy dog.",
          "Ünïcödé: café, naïve, 東京 and emoji 🙂 too!", "spaces  twice,  and\ttabs", "ﬁne ligatures (NFKC)"] * 20
TEXT = ["hello, world", "  leading and trailing  ", "café 東京 🙂", "x,y;z  (a)", "a <mask> in [SEP] text",
        "ﬁne", "unknown ⌘ char"]


def _byte_level() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<pad>",
                                                                                         "<mask>", "<unk>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def _tokenizer(kind: str) -> Tokenizer:
    if kind == "byte-level bpe":
        return _byte_level()
    return train_tokenizer([CORPUS], TokenizerConfig(kind=kind, vocab_size=200))


@pytest.fixture(scope="module", params=["bpe", "byte-level bpe", "unigram", "wordpiece"])
def tok(request) -> Tokenizer:
    return _tokenizer(request.param)


@pytest.mark.quick
def test_each_lines_token_bytes_sum_to_the_lines_utf8_bytes(tok):
    specials = frozenset(i for i in (tok.token_to_id(t) for t in ("<mask>", "[SEP]", "<pad>")) if i is not None)
    ids, nbytes = encode_lines_with_bytes(tok, TEXT, specials)
    for line, line_ids, line_bytes in zip(TEXT, ids, nbytes):
        assert len(line_ids) == len(line_bytes) and min(line_bytes) >= 0
        assert sum(line_bytes) == len(line.encode()), (line, tok.encode(line).tokens, line_bytes)
    assert sum(encode_lines_with_bytes(tok, ["hello, world"])[1][0]) == 12


@pytest.mark.quick
def test_joined_validation_ids_and_bytes_stay_aligned(tok):
    flat, nbytes = encode_joined_with_bytes(tok, TEXT, sep_id=1)
    assert flat.shape == nbytes.shape
    assert int(nbytes.sum()) == sum(len(line.encode()) for line in TEXT)
    assert (nbytes[flat == 1] == 0).all() or 1 in encode_lines_with_bytes(tok, TEXT)[0][0]


@pytest.mark.quick
def test_the_evaluation_sums_the_bytes_of_the_scored_targets_only(tmp_path):
    """A validation shard written with its bytes, read back by the evaluation's own dataset."""
    import tensorflow as tf

    from tpu_ray.prepare.tfrecord import examples_file
    from tpu_ray.train.eval_set import EvalSet, eval_dataset, scored_bytes
    from tpu_ray.train.inputs import MaskSpec

    rows = np.arange(10, 10 + 4 * 8, dtype=np.int64).reshape(4, 8)
    row_bytes = np.arange(4 * 8, dtype=np.int64).reshape(4, 8) % 5 + 1
    path = tmp_path / "validation-00000-4.tfrecord"
    path.write_bytes(examples_file(rows, row_bytes))
    spec = MaskSpec(0.5, 3, 64, (0, 1, 2, 3), 8)
    es = EvalSet("s", ((str(path), 4),), "id", 7)
    want = got = 0.0
    for k, batch in enumerate(eval_dataset(es, 8, 2, 1, spec)):  # the set's order: 2 samples a batch
        nbytes, unknown = (float(x) for x in scored_bytes(batch))
        assert unknown == 0
        got += nbytes
        for b, (positions, labels) in enumerate(zip(batch["mlm_positions"].numpy(), batch["mlm_labels"].numpy())):
            sample = 2 * k + b
            assert all(rows[sample][p] == lab for p, lab in zip(positions, labels) if lab != -100)
            want += sum(int(row_bytes[sample][p]) for p, lab in zip(positions, labels) if lab != -100)
    assert got == want > 0
    # Shards written without bytes give no figure, not a guess.
    old = tmp_path / "old-00000-4.tfrecord"
    old.write_bytes(examples_file(rows))
    batch = next(iter(eval_dataset(EvalSet("s", ((str(old), 4),), "id", 7), 8, 4, 1, spec)))
    assert float(scored_bytes(batch)[1]) == float(tf.reduce_sum(tf.cast(batch["mlm_labels"] != -100, tf.float32))) > 0
