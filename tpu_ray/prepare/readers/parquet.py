"""Parquet files: units of whole row groups, the text column only (tabular.py reads them)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from tpu_ray.prepare import tabular
from tpu_ray.prepare.readers import register
from tpu_ray.prepare.readers.base import CorpusFile, PlanContext, Reader, WorkUnit
from tpu_ray.prepare.streams import Chunk, Counts, chunked, lines_of


@register
class ParquetReader(Reader):
    fmt = "parquet"
    description = "a range of whole row groups, the text column only"
    suffixes = (".parquet",)

    def where(self, unit: WorkUnit) -> str:
        return f"{unit.source} row groups {unit.start}-{unit.end}"

    def warm(self) -> None:
        import pyarrow.parquet  # noqa: F401

    def plan(self, file: CorpusFile, ctx: PlanContext) -> list[WorkUnit]:
        corpus, shard = ctx.corpus, ctx.shard
        path = file.path
        groups = tabular.parquet_groups(path, corpus.text_field, corpus.text_lists)
        ranges = tabular.pack_groups(groups, shard.unit_bytes, shard.unit_rows, corpus.max_bytes)
        units, before = [], 0  # rows of the file before each unit: max_rows cuts inside a row group
        for s, e in ranges:
            if corpus.max_rows is not None and before >= corpus.max_rows:
                break
            rows = sum(r for r, _ in groups[s:e])
            cap = corpus.max_rows - before if corpus.max_rows is not None and before + rows > corpus.max_rows else None
            units.append(WorkUnit(0, path, self.fmt, s, s, e, **ctx.common, **ctx.stream,  # type: ignore[arg-type]
                                  max_rows=cap))
            before += rows
        return units

    def chunks(self, unit: WorkUnit, counts: Counts) -> Iterator[Chunk]:
        items = tabular.parquet_items(unit.source, unit.start, unit.end, unit.text_field, unit.text_lists, counts)
        if unit.max_rows is not None:
            items = itertools.islice(items, unit.max_rows)
        # max_bytes is applied at planning, by whole row groups
        for train, validation in chunked(items, unit.chunk_bytes, unit.val_fraction):
            yield Chunk(lines_of(train), lines_of(validation))

    def preflight(self, path: str, corpus, head: bytes | None, counts: Counts) -> None:
        """The footer only: not parquet, no text column, a column that is not text."""
        tabular.parquet_groups(path, corpus.text_field, corpus.text_lists)
