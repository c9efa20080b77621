"""The corpus checked before a stage writes anything into the run directory (see preflight_corpus)."""

from __future__ import annotations

from tpu_ray import storage
from tpu_ray.errors import UserError

# Bytes sniffed at the start of each corpus file for NUL bytes (binary files given as text).
SNIFF_BYTES = 8192
SNIFF_FILES = 64


def preflight_corpus(cfg) -> list[str]:
    """Check the corpus before a stage writes anything into the run directory: a typo'd, empty or
    binary corpus must not leave a run directory whose saved config then refuses the corrected rerun.

    Cheap: expands paths and globs, reads sizes, and sniffs the first bytes of the first text files
    (no work-unit planning, which reads at every unit boundary). The built-in corpus and hf:
    datasets are left to their stage (reading them writes or downloads). Returns the files checked.
    """
    from tpu_ray.config import BUILTIN_CORPUS
    from tpu_ray.prepare.corpus import WorkUnit, decode_text, parquet_rows, resolve_files
    from tpu_ray.prepare.formats import detect

    checked: list[str] = []
    named = cfg.corpus.named_sources()
    prefix = {n: "corpus" if cfg.corpus.sources is None else f"corpus.sources.{n}" for n in named}
    for field, source, corpus in [(f"{prefix[n]}.{key}", getattr(src, key), src) for n, src in named.items()
                                  for key in ("source", "validation_source")]:
        if not source or source == BUILTIN_CORPUS or source.startswith("hf:"):
            continue
        files = resolve_files(source, field)
        if all(fmt != "hf_disk" and storage.size(path) == 0 for path, fmt in files):
            raise UserError(f"{field}={source!r}: the corpus is empty; point it at text")
        for path, fmt in files[:SNIFF_FILES]:
            if fmt == "parquet":  # reads the footer only: not parquet, no text column, not text
                parquet_rows(path, corpus.text_field, corpus.text_lists)
            if fmt in ("txt", "jsonl") and detect(path)[1] is None:  # compressed ones: their stage reads them
                with storage.open(path, "rb") as f:
                    head = f.read(SNIFF_BYTES)
                # The corpus reader's own one-line errors: NUL bytes, and non-UTF-8 under
                # encoding_errors=fail (whole lines only: a character cut at the sniff's end is fine).
                lines = head[: head.rfind(b"\n") + 1]
                policy = corpus.encoding_errors if lines else "replace"
                decode_text(lines or head, WorkUnit(0, path, fmt, 0, 0, len(head), encoding_errors=policy), 0)
        checked += [path for path, _ in files]
    return checked