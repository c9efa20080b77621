"""Shared fixtures: real data from ../shared/data, a real local Ray cluster, a tiny trained tokenizer.
Plain helper functions live in tests/helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Under pytest-xdist several Ray clusters run on this machine at once (one per worker, and the
# multi-node ones some tests build). Ray's default, with no address, joins the newest of them: a
# run in one worker once trained on another worker's 3-node cluster and was refused. RAY_ADDRESS=local
# makes every address-less ray.init() here (in-process or in a child) start a cluster of its own;
# tests that connect somewhere pass the address, and those about RAY_ADDRESS itself set or remove it.
# Ray's own Jobs client and `ray job` CLI let RAY_ADDRESS override the address they are given: tests
# calling them directly remove it; tpu-ray's client hides it behind an explicit address (the jobs
# tests, run with it set, hold that).
os.environ.setdefault("RAY_ADDRESS", "local")

from tests.helpers import REPO, WIKITEXT, start_local_ray, tiny_config, wikitext_slice  # noqa: F401

pytest_plugins = ["tests.timing", "tests.gcs_emulator", "tests.own_process"]


@pytest.fixture(scope="session")
def wikitext() -> Path:
    if not (WIKITEXT / "valid.txt").exists():
        pytest.fail(f"test data missing: {WIKITEXT} (the repo must sit beside shared/)")
    return WIKITEXT


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory, wikitext) -> Path:
    """About 300 KB of real WikiText-2, cut at a line boundary."""
    return wikitext_slice(tmp_path_factory, 300_000, "small.txt")


@pytest.fixture(scope="session")
def ray_local():
    yield start_local_ray()
    import ray

    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory, small_corpus) -> str:
    """A Unigram tokenizer (vocab 800) trained on the small corpus, saved as a transformers dir."""
    from tpu_ray.config import TokenizerConfig
    from tpu_ray.prepare.tokenizer import save_tokenizer, train_tokenizer

    lines = [s for s in small_corpus.read_text().splitlines() if s.strip()]
    tok = train_tokenizer([lines], TokenizerConfig(vocab_size=800))
    out = str(tmp_path_factory.mktemp("tok") / "tokenizer")
    save_tokenizer(tok, out, 64)
    return out


@pytest.fixture(scope="session")
def tiny_roberta_run(tmp_path_factory, small_corpus, ray_local) -> Path:
    """A tpu-ray run (roberta, tiny, Unigram 800, dropout 0) trained 30 steps on the small corpus: the
    checkpoint tests/test_init_from.py continues from and tests/test_vocabulary.py extends (one run
    for both when they share a process). Read only: tests copy what they change."""
    from tpu_ray.pipeline import Pipeline

    run = tmp_path_factory.mktemp("tiny-roberta") / "run"
    Pipeline(tiny_config(run, small_corpus, **{"train.steps": 30, "model.dropout": 0.0})).run()
    return run


@pytest.fixture(scope="session")
def mixed_run(tmp_path_factory):
    """A real three-source run (domain 0.8, general 0.2, general_test evaluation only), 40 steps:
    tests/test_mixture.py and tests/test_eval_set.py read it."""
    from tpu_ray.config import RunConfig
    from tpu_ray.pipeline import Pipeline

    start_local_ray()
    tmp = tmp_path_factory.mktemp("mix")
    general = tmp / "general.txt"
    general.write_bytes(_lines((WIKITEXT / "valid.txt").read_bytes(), 300_000))
    held_out = tmp / "held_out.txt"
    held_out.write_bytes(_lines((WIKITEXT / "test.txt").read_bytes(), 60_000))
    cfg = RunConfig.from_dict({
        "output_dir": str(tmp / "run"), "ray": {"address": "local"},
        "corpus": {"sources": {"domain": {"source": "builtin:python-docs", "weight": 0.8, "max_bytes": 400_000},
                               "general": {"source": str(general), "weight": 0.2},
                               "general_test": {"source": str(held_out), "weight": 0}}},
        "tokenizer": {"vocab_size": 800}, "shard": {"seq_len": 32, "unit_bytes": 65536},
        "train": {"steps": 40, "batch_size": 32, "learning_rate": 1e-3, "warmup_steps": 2, "log_every": 10,
                  "eval_every": 20, "checkpoint_every": 20, "shuffle_buffer": 256, "placement": "local"},
        "eval": {"samples": 48}})
    result = Pipeline(cfg).run()
    return cfg, result


def _lines(data: bytes, n: int) -> bytes:
    data = data[:n]
    return data[: data.rfind(b"\n") + 1]
