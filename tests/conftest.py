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

from tests.helpers import REPO, WIKITEXT, start_local_ray, tiny_config, wikitext_slice  # noqa: F401

pytest_plugins = ["tests.gcs_emulator"] if (Path(__file__).parent / "gcs_emulator.py").exists() else []


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
