"""Shared fixtures: real data from ../shared/data, a real local Ray cluster, a tiny trained tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

pytest_plugins = ["tests.gcs_emulator"] if (Path(__file__).parent / "gcs_emulator.py").exists() else []

REPO = Path(__file__).resolve().parents[1]
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext-2"


@pytest.fixture(scope="session")
def wikitext() -> Path:
    if not (WIKITEXT / "valid.txt").exists():
        pytest.fail(f"test data missing: {WIKITEXT} (the repo must sit beside shared/)")
    return WIKITEXT


def wikitext_slice(tmp_path_factory, nbytes: int, name: str) -> Path:
    """The first ~nbytes of WikiText-2's validation text, cut at a line boundary, as a new file."""
    data = (WIKITEXT / "valid.txt").read_bytes()[:nbytes]
    path = tmp_path_factory.mktemp(name.split(".")[0]) / name
    path.write_bytes(data[: data.rfind(b"\n") + 1])
    return path


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory, wikitext) -> Path:
    """About 300 KB of real WikiText-2, cut at a line boundary."""
    return wikitext_slice(tmp_path_factory, 300_000, "small.txt")


def start_local_ray():
    """The suite's real local Ray cluster (2 CPUs, no dashboard), started if it is not running.

    address="local": always a fresh cluster of our own, never one a `ray start` left running.
    Tests that swap in a multi-node `Cluster` call this afterwards to put it back.
    """
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    return ray


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


def tiny_config(run_dir: Path, corpus: Path, **overrides):
    """A RunConfig for fast CPU tests (tiny model, short sequences)."""
    from tpu_ray.config import RunConfig

    base = {
        "name": "t", "output_dir": str(run_dir),
        "corpus": {"source": str(corpus), "validation_fraction": 0.1},
        "tokenizer": {"vocab_size": 800},
        "shard": {"seq_len": 64, "unit_bytes": 65536},
        "model": {"preset": "tiny"},
        "train": {"steps": 20, "batch_size": 16, "learning_rate": 1e-3, "warmup_steps": 2, "log_every": 5,
                  "eval_every": 10, "eval_batches": 2, "checkpoint_every": 10, "shuffle_buffer": 256},
    }
    cfg = RunConfig.from_dict(base)
    return cfg.override(overrides) if overrides else cfg
