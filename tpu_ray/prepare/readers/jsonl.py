"""JSON lines (.jsonl, .json, .ndjson; compressed or not): plain text whose lines are records.

Planned exactly like plain text (byte ranges aligned to lines, streams, packs); each record's text
field (records.py's rule) becomes the text, split into lines like a .txt file's.
"""

from __future__ import annotations

from collections.abc import Iterator

from tpu_ray.errors import UserError
from tpu_ray.prepare.readers import register
from tpu_ray.prepare.readers.base import WorkUnit
from tpu_ray.prepare.readers.text import TextReader
from tpu_ray.prepare.streams import Counts, json_texts


@register
class JsonLinesReader(TextReader):
    fmt = "jsonl"
    description = ("byte range of a JSON-lines file aligned to lines (compressed: the whole file, streamed); small "
                   "files packed")
    suffixes = (".jsonl", ".json", ".ndjson")
    cuts_long_lines = False  # a record is never cut: one longer than the limit is a bad record (streams.py)

    def range_texts(self, text: str, offset: int, unit: WorkUnit, counts: Counts) -> list[str]:
        refuse_array(text, offset, unit.source)
        return json_texts(_json_lines(text, offset), unit.source, unit.text_field, unit.text_lists, counts)

    def file_texts(self, text: str, path: str, unit: WorkUnit, counts: Counts) -> list[str]:
        refuse_array(text, 0, path)
        return json_texts(_json_lines(text, 0), path, unit.text_field, unit.text_lists, counts)


    def sniff_records(self, text: str, path: str, corpus, counts: Counts) -> None:
        refuse_array(text, 0, path)
        skip = Counts(skip_bad=True, warned=True)  # a record cut or broken: its stage judges it
        json_texts(_json_lines(text, 0), path, corpus.text_field, corpus.text_lists, skip)
        counts.records += skip.records - len(skip.bad)
        counts.with_field += skip.with_field
        counts.missing += skip.missing
        counts.first_missing = counts.first_missing or skip.first_missing


def refuse_array(text: str, offset: int, path: str) -> None:
    """A file that opens with `[` is one JSON array (how many corpora ship as .json), not JSON lines:
    refused naming the shape and the conversion, not reported as every line "not a JSON line"."""
    if offset == 0 and text.lstrip("\ufeff \t\r\n").startswith("["):
        raise UserError(f"{path}: one JSON array ([{{...}}, {{...}}]), not JSON lines (one object per line); "
                        f"convert it: jq -c '.[]' {path} > records.jsonl")


def _json_lines(text: str, offset: int) -> Iterator[tuple[str, str]]:
    """("byte N", line) for the lines of a JSON-lines byte range starting at byte `offset`."""
    for line in text.split("\n"):
        yield f"byte {offset}", line
        offset += len(line.encode("utf-8")) + 1
