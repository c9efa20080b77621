"""model.output_bias=unigram (issue 49): a fresh model's head starts at the training tokens' log
frequencies, so its first loss is the word-frequency baseline's, not ln V's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.test_train import _cfg, _records, checkpoint_weights
from tpu_ray.errors import UserError

SEQ = 64


def _zipf_shards(d, vocab_size: int, seed: int = 0) -> np.ndarray:
    """Shards whose ids follow 1/rank over 5..vocab (<s> first, </s> last): the rows of train, returned."""
    from tpu_ray.prepare.tfrecord import serialize_examples, write_records

    rng = np.random.default_rng(seed)
    ids = np.arange(5, vocab_size)
    p = 1.0 / np.arange(1, len(ids) + 1)
    d.mkdir(parents=True)
    train = []
    for split, sizes in (("train", (70, 60)), ("validation", (40,))):
        for i, n in enumerate(sizes):
            rows = rng.choice(ids, size=(n, SEQ), p=p / p.sum()).astype(np.int64)
            rows[:, 0], rows[:, -1] = 0, 2
            with open(d / f"{split}-{i:05d}-{n}.tfrecord", "wb") as f:
                write_records(f, serialize_examples(rows))
            if split == "train":
                train.append(rows)
    return np.concatenate(train)


def test_the_head_starts_at_the_log_frequencies_of_the_training_tokens(tmp_path, tiny_tokenizer_dir):
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.loop import train

    tok = tokenizer_info(tiny_tokenizer_dir)
    rows = _zipf_shards(tmp_path / "shards", tok.vocab_size)
    # One step at lr ~0: the checkpoint holds the bias as it started, the logged loss is step 0's.
    cfg = _cfg(tmp_path / "run", tmp_path / "shards", tiny_tokenizer_dir, **{
        "model.output_bias": "unigram", "model.dropout": 0.0, "train.steps": 1, "train.warmup_steps": 0,
        "train.learning_rate": 1e-9, "train.log_every": 1, "train.eval_every": 1, "train.checkpoint_every": 1})
    train(cfg)

    # Independently: counts of the maskable ids (every id but the specials that are never masked).
    never = [i for i in tok.special_ids if i != tok.unk_id]
    counts = np.bincount(rows.ravel(), minlength=tok.vocab_size).astype(np.float64)
    counts[never] = 0
    maskable = tok.vocab_size - len(never)
    log_p = np.log((counts + 0.5) / (counts.sum() + 0.5 * maskable))
    log_p[never] = log_p.min()
    biases = [v for k, v in checkpoint_weights(tmp_path / "run").items()
              if "bias" in k and "OPTIMIZER_SLOT" not in k and v.shape == (tok.vocab_size,)]
    assert len(biases) == 1
    assert np.max(np.abs(biases[0] - (log_p - log_p.mean()))) < 1e-4

    event = next(e for e in _records(tmp_path / "run", "event") if e["event"] == "output_bias")
    assert event["tokens_counted"] == counts.sum() == rows.size - 2 * len(rows)
    keep = np.ones(tok.vocab_size, bool)
    keep[never] = False
    q = np.exp(log_p[keep])
    entropy = float(-(q * np.log(q)).sum() / q.sum())
    assert event["frequency_loss"] == pytest.approx(entropy, abs=1e-3)
    assert entropy < math.log(maskable) - 0.5  # the 1/rank text is far from uniform
    # The first loss is the frequency baseline's (a zero bias starts near ln V), within the noise of
    # the random weights' logits.
    first = _records(tmp_path / "run", "train")[0]["loss"]
    assert abs(first - entropy) < 0.25, (first, entropy, math.log(maskable))


@pytest.mark.quick
def test_a_run_from_trained_weights_refuses_a_unigram_bias(tmp_path):
    from tests.helpers import tiny_config

    for over in ({"model.init_from": str(tmp_path / "ckpt")}, {"train.branch_from": str(tmp_path / "stable")}):
        with pytest.raises(UserError, match=r"model.output_bias=unigram .* starts from trained weights: use zeros"):
            tiny_config(tmp_path / "run", tmp_path / "c.txt", **{"model.output_bias": "unigram", **over})
