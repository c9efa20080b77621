"""CSV and TSV files with a header row (compressed or not): a whole file, streamed.

A quoted field may span lines, so a CSV file cannot be cut into byte ranges: one unit per file,
read once by Python's csv module (streams.csv_records) and cut into chunks of about a unit of text.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from tpu_ray.prepare.readers import register
from tpu_ray.prepare.readers.base import CorpusFile, PlanContext, Reader, WorkUnit
from tpu_ray.prepare.readers.text import streamed_file_unit
from tpu_ray.prepare.streams import Chunk, Counts, chunked, csv_records, lines_of


@register
class CsvReader(Reader):
    fmt = "csv"
    description = "a whole CSV file with a header row, streamed (compressed or not)"
    suffixes = (".csv",)
    compressible = True
    delimiter = ","

    def plan(self, file: CorpusFile, ctx: PlanContext) -> list[WorkUnit]:
        return streamed_file_unit(self, file, ctx)

    def chunks(self, unit: WorkUnit, counts: Counts) -> Iterator[Chunk]:
        items = csv_records(unit.source, unit.compression, self.delimiter, unit.text_field, unit.encoding_errors,
                            counts)
        if unit.max_rows is not None:
            items = itertools.islice(items, unit.max_rows)
        for train, validation in chunked(items, unit.chunk_bytes, unit.val_fraction, unit.max_bytes):
            yield Chunk(lines_of(train), lines_of(validation))


@register
class TsvReader(CsvReader):
    fmt = "tsv"
    description = "a whole TSV file with a header row, streamed (compressed or not)"
    suffixes = (".tsv",)
    delimiter = "\t"
