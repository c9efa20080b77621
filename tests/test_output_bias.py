"""How a fresh model starts. model.output_bias=unigram: the head starts at the training
tokens' log frequencies, so its first loss is the word-frequency baseline's, not ln V's;
model.initializer_range: the scale of the random weights."""

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

    # The lever is in the model card and the report, with what the event counted.
    from tpu_ray.report import write_report

    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert "- recipe: peak learning rate 1e-09, linear: warm-up 0" in card
    assert "output bias unigram, initializer_range the type's default" in card, card
    page = (tmp_path / "run" / "report.html").read_text() if write_report(str(tmp_path / "run")) else ""
    assert f"log frequencies of {event['tokens_counted']:,} training tokens" in page
    assert f"frequency-only loss of {event['frequency_loss']:.4f} nats" in page


@pytest.mark.quick
def test_an_initializer_range_for_a_type_without_one_is_refused(tmp_path):
    from tests.helpers import tiny_config

    with pytest.raises(UserError, match=r"model.initializer_range: xlm has no initializer_range .* leave it unset"):
        tiny_config(tmp_path / "run", tmp_path / "c.txt", **{"model.model_type": "xlm", "model.initializer_range": 0.05})


def test_initializer_range_scales_a_fresh_models_weights(tmp_path, tiny_tokenizer_dir):
    """model.initializer_range is the std of a fresh model's embeddings and dense kernels."""
    import tensorflow as tf
    from transformers import TFAutoModelForMaskedLM

    from tests.helpers import tiny_config
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.model import hf_config

    tok = tokenizer_info(tiny_tokenizer_dir)
    stds = {}
    for scale in (None, 0.1):
        cfg = tiny_config(tmp_path / "run", tmp_path / "c.txt", **{"model.initializer_range": scale})
        tf.keras.utils.set_random_seed(0)
        model = TFAutoModelForMaskedLM.from_config(hf_config(cfg.model_spec, tok))
        model(model.dummy_inputs)
        weights = {w.name: w.numpy() for w in model.weights}
        word = next(v for k, v in weights.items() if "word_embeddings" in k)
        query = next(v for k, v in weights.items() if "query/kernel" in k)
        stds[scale] = (float(word.std()), float(query.std()))
    # A truncated normal at 2 std has 0.88 of the std asked for; the ratio of two is the ratio asked for.
    assert stds[None][0] == pytest.approx(0.02 * 0.88, rel=0.05)
    assert stds[0.1][0] / stds[None][0] == pytest.approx(5, rel=0.05)
    assert stds[0.1][1] / stds[None][1] == pytest.approx(5, rel=0.1)


def test_a_three_source_mixture_of_100_files_starts_at_its_weighted_frequencies(tmp_path):
    """Every file is counted (not the first 64 in manifest order: the first source only), each source
    by its weight; capped, the same share of every file's records."""
    from tpu_ray.prepare.tfrecord import serialize_examples, write_records
    from tpu_ray.train.output_bias import token_log_frequencies

    vocab, never, rng = 60, [0, 1, 2, 3, 4], np.random.default_rng(7)
    sources, rows_of = {}, {}
    for name, weight, n_files, low in (("a", 0.5, 50, 5), ("b", 0.3, 30, 20), ("c", 0.2, 20, 40)):
        listed, rows_of[name] = [], []
        for i in range(n_files):
            n = int(rng.integers(2, 9))
            rows = rng.integers(low, low + 20, size=(n, 8)).astype(np.int64)
            rows[:, 0], rows[:, -1] = 0, 2
            path = tmp_path / f"{name}-{i:03d}.tfrecord"
            with open(path, "wb") as f:
                write_records(f, serialize_examples(rows))
            listed.append((str(path), n))
            rows_of[name].append(rows)
        sources[name] = (weight, listed)

    def expected(take) -> np.ndarray:  # take(rows of a file) -> the rows counted
        mixed, counted = np.zeros(vocab), 0
        for name, (weight, _) in sources.items():
            counts = np.bincount(np.concatenate([take(r) for r in rows_of[name]]).ravel(), minlength=vocab).astype(float)
            counts[never] = 0
            counted += counts.sum()
            mixed += weight * counts / counts.sum()
        log_p = np.log((mixed * counted + 0.5) / (counted + 0.5 * (vocab - len(never))))
        log_p[never] = log_p.min()
        return log_p

    log_p, counted = token_log_frequencies(sources, 8, vocab, never)
    assert counted.files == 100 and counted.records == counted.of_records
    assert np.max(np.abs(log_p - expected(lambda r: r))) < 1e-5
    assert "every record" in counted.describe() and "a 0.500, b 0.300, c 0.200" in counted.describe()
    total = sum(n for _, listed in sources.values() for _, n in listed)
    log_p, counted = token_log_frequencies(sources, 8, vocab, never, max_tokens=8 * (total // 2))
    assert np.max(np.abs(log_p - expected(lambda r: r[: math.ceil(len(r) * (total // 2) / total)]))) < 1e-5
    assert counted.files == 100 and counted.records < counted.of_records


@pytest.mark.quick
def test_counting_token_frequencies_raises_no_warning_a_user_cannot_act_on(tmp_path):
    """Every run with model.output_bias=unigram (the quickstart's) printed TensorFlow's UserWarning
    "The `deterministic` argument has no effect unless ... num_parallel_calls"."""
    import warnings

    import numpy as np

    from tpu_ray.prepare.tfrecord import serialize_examples, write_records
    from tpu_ray.train.output_bias import token_log_frequencies

    rows = np.arange(2 * 3 * 8).reshape(2, 3, 8) % 20 + 5
    files = []
    for i, part in enumerate(rows):
        path = tmp_path / f"train-{i:05d}-3.tfrecord"
        with open(path, "wb") as f:
            write_records(f, serialize_examples(part.astype(np.int64)))
        files.append(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _log_p, counted = token_log_frequencies({"corpus": (1.0, [(f, 3) for f in files])}, 8, 32,
                                                never_counted=[0, 1, 2])
    assert counted.tokens == rows.size  # every id here is maskable: all counted
