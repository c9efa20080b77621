"""`datasets` save_to_disk directories (a Dataset, or a DatasetDict's split): row ranges, memory-mapped.

Also the base of the packaged-builder reader (hub.py), whose datasets are the same kind of object.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from tpu_ray.prepare import tabular
from tpu_ray.prepare.readers import register
from tpu_ray.prepare.readers.base import CorpusFile, PlanContext, Reader, WorkUnit
from tpu_ray.prepare.streams import Chunk, Counts, chunked, lines_of


@register
class SavedDatasetReader(Reader):
    fmt = "hf_disk"
    description = ("a row range of a datasets save_to_disk directory (Dataset or a DatasetDict split), "
                   "memory-mapped")
    cacheable = False  # planned from the Arrow metadata, cheaply, every time
    sized = False  # a directory

    def where(self, unit: WorkUnit) -> str:
        return f"{unit.source} rows {unit.start}-{unit.end}"

    def warm(self) -> None:
        import datasets  # noqa: F401

    def dataset(self, unit: WorkUnit) -> tuple[Any, str]:
        """The unit's Dataset and how errors name it."""
        return tabular.load_saved(unit.source, unit.hf_split), unit.source

    def plan_rows(self, ds: Any, source: str, where: str, ctx: PlanContext) -> list[WorkUnit]:
        """Units of row ranges of about a unit of text (and at most unit_rows rows)."""
        corpus, shard = ctx.corpus, ctx.shard
        ranges = tabular.dataset_ranges(ds, where, corpus.text_field, corpus.text_lists, shard.unit_bytes,
                                        shard.unit_rows, corpus.max_bytes)
        return [WorkUnit(0, source, self.fmt, s, s, e, **ctx.common, **ctx.stream)  # type: ignore[arg-type]
                for s, e in ctx.first_rows(ranges)]

    def plan(self, file: CorpusFile, ctx: PlanContext) -> list[WorkUnit]:
        return self.plan_rows(tabular.load_saved(file.path, ctx.corpus.hf_split), file.path, file.path, ctx)

    def chunks(self, unit: WorkUnit, counts: Counts) -> Iterator[Chunk]:
        ds, where = self.dataset(unit)
        joined = tabular.dataset_column(ds, where, unit.text_field, unit.text_lists)
        items = tabular.dataset_items(ds, unit.start, unit.end, unit.text_field, joined, counts)
        if unit.max_rows is not None:
            items = itertools.islice(items, unit.max_rows)
        # max_bytes is applied at planning, by rows
        for train, validation in chunked(items, unit.chunk_bytes, unit.val_fraction):
            yield Chunk(lines_of(train), lines_of(validation))
