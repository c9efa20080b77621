"""Whole-word masking and the masking recipes (train.whole_word_mask, mask_prob up to 40%, the
80/10/10 split as config): TF ops inside tf.data, static shapes, word starts from the tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_ray.config import TokenizerConfig
from tpu_ray.families import family, training_order
from tpu_ray.train.inputs import IGNORE, MaskSpec, mask_tokens
from tpu_ray.train.words import continuation_table

SEQ = 64


@pytest.fixture(scope="module")
def lines(small_corpus) -> list[str]:
    return [s for s in small_corpus.read_text().splitlines() if len(s.split()) > 8][:3000]


def _tokenizer(lines, kind: str, model_type: str):
    from tpu_ray.prepare.tokenizer import train_tokenizer

    fam = family(model_type)
    return fam, train_tokenizer([lines], TokenizerConfig(kind=kind, vocab_size=1000), fam.tokens, training_order(fam))


@pytest.mark.parametrize("kind, model_type", [("bpe", "roberta"), ("unigram", "albert"), ("wordpiece", "bert")])
@pytest.mark.quick
def test_continuations_are_read_from_the_vocabulary(lines, kind, model_type):
    fam, tok = _tokenizer(lines, kind, model_type)
    table = continuation_table(tok.to_str())
    enc = tok.encode("The unbelievably magnificent hippopotamus", add_special_tokens=False)
    words = enc.word_ids  # the tokenizer's own word of each piece
    assert len(set(words)) < len(words)  # some word is several pieces here
    for i, (tid, w) in enumerate(zip(enc.ids, words)):
        assert table[tid] == (i > 0 and words[i - 1] == w), (enc.tokens, i)
    for t in fam.tokens.as_tuple():
        assert not table[tok.token_to_id(t)]  # special tokens start words


def _batch(lines, tok, fam, rows=64):
    cls, sep = tok.token_to_id(fam.tokens.cls), tok.token_to_id(fam.tokens.sep)
    ids = []
    for line in lines:
        e = tok.encode(line, add_special_tokens=False).ids
        ids.extend(e + [sep])
    out = np.array(ids[: rows * (SEQ - 2)], np.int32).reshape(rows, SEQ - 2)
    return np.concatenate([np.full((rows, 1), cls, np.int32), out, np.full((rows, 1), sep, np.int32)], axis=1)


def _spec(tok, fam, prob, words, mask_fraction=0.8, random_fraction=0.1):
    specials = tuple(tok.token_to_id(t) for t in fam.tokens.as_tuple())
    return MaskSpec(prob, tok.token_to_id(fam.tokens.mask), tok.get_vocab_size(), specials,
                    target_ids=(tok.token_to_id(fam.tokens.unk),), continues_word=words,
                    mask_fraction=mask_fraction, random_fraction=random_fraction)


@pytest.mark.parametrize("kind, model_type", [("bpe", "roberta"), ("wordpiece", "bert")])
@pytest.mark.quick
def test_a_word_is_masked_whole_or_not_at_all(lines, kind, model_type):
    fam, tok = _tokenizer(lines, kind, model_type)
    table = continuation_table(tok.to_str())
    ids = _batch(lines, tok, fam)
    _, labels = mask_tokens(tf.constant(ids), tf.constant([3, 4], tf.int64), _spec(tok, fam, 0.15, table))
    selected = labels.numpy() != IGNORE
    cont = np.array(table)[ids]
    special = np.isin(ids, [tok.token_to_id(t) for t in fam.tokens.as_tuple()])
    split_words = 0
    for r in range(ids.shape[0]):
        for i in range(1, SEQ):
            if cont[r, i] and not special[r, i - 1]:  # a row cut mid-word: its first piece follows [CLS]
                assert selected[r, i] == selected[r, i - 1], (r, i)  # a piece follows its word
                split_words += 1
    assert split_words > 100  # many multi-piece words were checked
    assert 0.11 < selected.mean() < 0.19


@pytest.mark.parametrize("prob", [0.15, 0.3, 0.4])
@pytest.mark.quick
def test_masking_rates_up_to_40_percent_with_a_configurable_split(lines, prob):
    fam, tok = _tokenizer(lines, "bpe", "roberta")
    ids = _batch(lines, tok, fam, rows=256)
    mask_id = tok.token_to_id(fam.tokens.mask)
    masked, labels = mask_tokens(tf.constant(ids), tf.constant([5, 6], tf.int64),
                                 _spec(tok, fam, prob, None, mask_fraction=0.5, random_fraction=0.2))
    masked, labels = masked.numpy(), labels.numpy()
    selected = labels != IGNORE
    eligible = ~np.isin(ids, [tok.token_to_id(t) for t in (fam.tokens.cls, fam.tokens.sep, fam.tokens.pad,
                                                             fam.tokens.mask)])
    assert abs(selected.sum() / eligible.sum() - prob) < 0.02
    as_mask = (masked == mask_id)[selected].mean()
    unchanged = (masked == ids)[selected].mean()
    assert abs(as_mask - 0.5) < 0.03 and abs(unchanged - 0.3) < 0.03  # 50% mask, 20% random, 30% kept


@pytest.mark.quick
def test_whole_word_training_input_keeps_static_shapes(tmp_path, lines):
    """The trainer's tf.data pipeline with whole words: every shape fully defined (one XLA program)."""
    from tpu_ray.prepare.tfrecord import serialize_examples, write_records
    from tpu_ray.train.inputs import predictions_per_sequence, train_dataset

    fam, tok = _tokenizer(lines, "wordpiece", "bert")
    ids = _batch(lines, tok, fam)
    with open(tmp_path / "train-00000-64.tfrecord", "wb") as f:
        write_records(f, serialize_examples(ids.astype(np.int64)))
    spec = _spec(tok, fam, 0.4, continuation_table(tok.to_str()))
    spec = MaskSpec(**{**spec.__dict__, "predictions": predictions_per_sequence(SEQ, 0.4, True)})
    ds = train_dataset([str(tmp_path / "train-00000-64.tfrecord")], SEQ, 8, spec, 0, 64)
    for name, s in ds.element_spec.items():
        assert s.shape.is_fully_defined(), (name, s.shape)
    batch = next(iter(ds))
    assert (batch["mlm_labels"].numpy() != IGNORE).sum() == (batch["labels"].numpy() != IGNORE).sum()


def test_training_with_whole_words_at_40_percent_traces_once(tmp_path, lines):
    from tests.test_model_types import family_setup, type_config
    from tpu_ray.train.loop import train

    tok_dir, shards = family_setup(tmp_path, "bert", lines)
    summary = train(type_config(tmp_path / "run", "bert", tok_dir, shards, **{
        "train.whole_word_mask": True, "train.mask_prob": 0.4, "train.steps_per_execution": 2}))
    assert summary["train_traces"] == 1 and np.isfinite(summary["final_loss"])


def _one_word_rows(table, cls: int, sep: int, rows: int = 48, seed: int = 0) -> np.ndarray:
    """Rows that are one word of SEQ - 2 pieces (a space-free CJK line under Metaspace)."""
    cont = np.flatnonzero(np.array(table))
    ids = np.random.default_rng(seed).choice(cont, size=(rows, SEQ))
    ids[:, 0], ids[:, -1] = cls, sep
    return ids.astype(np.int64)


def test_masked_pieces_beyond_the_bound_are_counted_and_the_bound_covers_long_words(tmp_path, lines):
    """Before, with a fixed bound (words of ~4 pieces), a masked 62-piece word lost most of its
    targets without a word; now every batch counts them (mlm_unscored), and the bound measured on
    the corpus's rows (whole_word_bound) covers such words: nothing is left unscored."""
    from tpu_ray.prepare.tfrecord import serialize_examples, write_records
    from tpu_ray.train.inputs import predictions_per_sequence, train_dataset, whole_word_bound

    fam, tok = _tokenizer(lines, "unigram", "albert")
    table = continuation_table(tok.to_str())
    ids = _one_word_rows(table, tok.token_to_id(fam.tokens.cls), tok.token_to_id(fam.tokens.sep))
    path = str(tmp_path / "train-00000-48.tfrecord")
    with open(path, "wb") as f:
        write_records(f, serialize_examples(ids))
    fixed = predictions_per_sequence(SEQ, 0.15, True)
    assert fixed < SEQ - 2
    spec = _spec(tok, fam, 0.15, table)

    def totals(predictions: int) -> tuple[int, int, int]:
        ds = train_dataset([path], SEQ, 16, MaskSpec(**{**spec.__dict__, "predictions": predictions}), 0, 48)
        masked = scored = unscored = 0
        for batch in ds.take(6):
            masked += int((batch["labels"].numpy() != IGNORE).sum())
            scored += int((batch["mlm_labels"].numpy() != IGNORE).sum())
            unscored += int(batch["mlm_unscored"].numpy().sum())
        return masked, scored, unscored

    masked, scored, unscored = totals(fixed)
    assert unscored > 0 and masked == scored + unscored  # every lost target is counted
    bound = whole_word_bound(ids, table, 0.15, spec.never_masked)
    assert bound == SEQ
    masked, scored, unscored = totals(bound)
    assert masked > 0 and unscored == 0 and masked == scored


def test_training_sizes_the_whole_word_bound_from_the_shards_and_reports_unscored(tmp_path, tiny_tokenizer_dir):
    """The trainer's MaskSpec takes the bound the shards' words need, and its train and eval records
    say how many masked pieces went unscored (none here)."""
    import json

    from tests.helpers import tiny_config
    from tpu_ray.prepare.tokenizer import load_tokenizer_json, tokenizer_info
    from tpu_ray.prepare.tfrecord import serialize_examples, write_records
    from tpu_ray.train.loop import mask_spec, train

    tok = tokenizer_info(tiny_tokenizer_dir)
    table = continuation_table(load_tokenizer_json(tiny_tokenizer_dir))
    shards = tmp_path / "shards"
    shards.mkdir()
    for split, n, seed in (("train", 48, 0), ("validation", 32, 1)):
        with open(shards / f"{split}-00000-{n}.tfrecord", "wb") as f:
            write_records(f, serialize_examples(_one_word_rows(table, tok.cls_id, tok.sep_id, n, seed)))
    cfg = tiny_config(tmp_path / "run", tmp_path / "unused.txt", **{
        "tokenizer.path": tiny_tokenizer_dir, "shard.dir": str(shards), "train.whole_word_mask": True,
        "train.steps": 2, "train.log_every": 1, "train.eval_every": 2, "eval.samples": 16,
        "train.placement": "local"})
    assert mask_spec(cfg.train, cfg.paths, tok).predictions == SEQ
    train(cfg)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["unscored_targets"] for r in records if r["kind"] == "train"] == [0, 0]
    assert [r["eval_unscored_targets"] for r in records if r["kind"] == "eval"] == [0]
