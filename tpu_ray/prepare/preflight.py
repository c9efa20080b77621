"""The corpus checked before a stage writes anything into the run directory (see preflight_corpus)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tpu_ray import storage
from tpu_ray.errors import UserError
from tpu_ray.prepare.streams import Counts

if TYPE_CHECKING:
    from tpu_ray.config import CorpusConfig

log = logging.getLogger("tpu_ray.prepare.corpus")

# Bytes sniffed at the start of each corpus file for NUL bytes (binary files given as text).
SNIFF_BYTES = 8192
SNIFF_FILES = 64


def preflight_corpus(corpus: CorpusConfig) -> list[str]:
    """Check the corpus before a stage writes anything into the run directory: a typo'd, empty or
    binary corpus must not leave a run directory whose saved config then refuses the corrected rerun.

    Cheap: expands paths and globs, reads sizes, and sniffs the first bytes of the first text files
    (no work-unit planning, which reads at every unit boundary). The built-in corpus and hf:
    datasets are left to their stage (reading them writes or downloads). Returns the files checked.
    """
    from tpu_ray.config import BUILTIN_CORPUS
    from tpu_ray.prepare.corpus import resolve_files
    from tpu_ray.prepare.readers import detect
    from tpu_ray.prepare.readers import reader

    checked: list[str] = []
    named = corpus.named_sources()
    prefix = {n: "corpus" if corpus.sources is None else f"corpus.sources.{n}" for n in named}
    for field, source, corpus in [(f"{prefix[n]}.{key}", getattr(src, key), src) for n, src in named.items()
                                  for key in ("source", "validation_source")]:
        if not source or source == BUILTIN_CORPUS or source.startswith("hf:"):
            continue
        files = resolve_files(source, field)
        if all(reader(fmt).sized and storage.size(path) == 0 for path, fmt in files):
            raise UserError(f"{field}={source!r}: the corpus is empty; point it at text")
        counts = Counts()
        for path, fmt in files[:SNIFF_FILES]:
            # Each reader's own cheap check (parquet: the footer; text: the first bytes of an
            # uncompressed file, by the reader's one-line errors; compressed ones: their stage reads them).
            r = reader(fmt)
            head = None
            if r.sniffs and detect(path)[1] is None:  # type: ignore[index]
                with storage.open(path, "rb") as f:
                    head = f.read(SNIFF_BYTES)
            r.preflight(path, corpus, head, counts)
        if counts.missing and not counts.with_field and counts.first_missing:
            where, keys = counts.first_missing
            # A warning, not a refusal: records without the field are skipped and counted wherever
            # they stand, and the rest of the corpus may have it (a corpus where none has it is
            # refused once it has been read).
            log.warning("%s=%r: none of the %d records sniffed has field %r (first: %s, fields: %s); if "
                        "corpus.text_field is wrong, stop and set it", field, source, counts.missing,
                        corpus.text_field, where, ", ".join(keys))
        checked += [path for path, _ in files]
    return checked