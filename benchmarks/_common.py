"""Benchmark inputs built from the repository's own test data (no downloads)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext-2"


def build_corpus(out: Path, megabytes: float) -> Path:
    """WikiText-2 (valid + test) concatenated until the file holds at least `megabytes` MB."""
    base = b"".join((WIKITEXT / name).read_bytes() for name in ("valid.txt", "test.txt"))
    if not base.endswith(b"\n"):
        base += b"\n"
    target = int(megabytes * 1_000_000)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        written = 0
        while written < target:
            f.write(base)
            written += len(base)
    return out


def train_benchmark_tokenizer(out_dir: Path, vocab_size: int = 10_000, seq_len: int = 128) -> str:
    """A Unigram tokenizer trained with tpu_ray.prepare.tokenizer on one copy of WikiText-2.

    One copy suffices: the corpus is that text repeated, so more copies change nothing learned.
    """
    from tpu_ray.config import TokenizerConfig
    from tpu_ray.prepare.tokenizer import save_tokenizer, train_tokenizer

    text = "".join((WIKITEXT / n).read_text(encoding="utf-8") for n in ("valid.txt", "test.txt"))
    lines = [s for s in text.splitlines() if s.strip()]
    tok = train_tokenizer([lines], TokenizerConfig(vocab_size=vocab_size))
    save_tokenizer(tok, str(out_dir), seq_len + 2)
    return str(out_dir)
