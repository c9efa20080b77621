"""Plain text files (.txt, .text, .md; compressed or not): the reader JSON lines builds on.

A plain file is cut into byte ranges aligned to line starts (every boundary found in one batch of
small ranged reads), so any number of actors read it in parallel; a compressed one cannot be
entered at an offset and is one unit, streamed in chunks (streams.py); small files are packed
several to a unit by the planner (plan_pack), read whole (plain) or streamed one after another.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

from tpu_ray import storage
from tpu_ray.prepare.readers import detect
from tpu_ray.prepare.readers import register
from tpu_ray.prepare.readers.base import CorpusFile, PlanContext, Reader, WorkUnit, decode_text
from tpu_ray.prepare.streams import Chunk, Counts, lines_of, packed_text_chunks, split_items, stream_text_chunks

log = logging.getLogger("tpu_ray.prepare.corpus")
_ALIGN_WINDOW = 64 * 1024
_MIN_WINDOW = 4096


def streamed_file_unit(reader: Reader, file: CorpusFile, ctx: PlanContext) -> list[WorkUnit]:
    """A whole file as one streamed unit (compressed files, CSV, the first max_rows records);
    max_bytes counts decompressed bytes (CSV: text bytes). None for an empty file."""
    corpus = ctx.corpus
    size = file.size if file.size >= 0 else storage.size(file.path)
    compression = detect(file.path)[1]  # type: ignore[index]
    return [WorkUnit(0, file.path, reader.fmt, 0, 0, size, compression=compression,  # type: ignore[arg-type]
                     max_bytes=corpus.max_bytes, max_rows=corpus.max_rows, **ctx.common, **ctx.stream)] if size else []


@register
class TextReader(Reader):
    fmt = "txt"
    description = ("byte range of a plain text file aligned to lines (compressed: the whole file, streamed); small "
                   "files packed")
    suffixes = (".txt", ".text", ".md")
    compressible = True
    packable = True
    sniffs = True
    # A line longer than corpus.max_line_bytes may be cut at a unit boundary (text is text); a JSON
    # record may not: its boundaries go to the next record boundary (readers/jsonl.py).
    cuts_long_lines = True

    # ---- how the text of a file becomes records (JSON lines overrides these) ----
    def range_texts(self, text: str, offset: int, unit: WorkUnit, counts: Counts) -> list[str]:
        """The texts of a byte range's decoded text starting at byte `offset` of the unit's file."""
        return [text]

    def file_texts(self, text: str, path: str, unit: WorkUnit, counts: Counts) -> list[str]:
        """The texts of one packed file, record by record (their sizes place the validation split)."""
        return text.split("\n")

    # ---- planning ----
    def plan(self, file: CorpusFile, ctx: PlanContext) -> list[WorkUnit]:
        corpus, shard, frac = ctx.corpus, ctx.shard, ctx.frac
        path = file.path
        compression = detect(path)[1]  # type: ignore[index]
        if compression or corpus.max_rows is not None:
            # Not splittable by byte range (compressed, or the first max_rows records wanted): one
            # unit, streamed in chunks.
            return streamed_file_unit(self, file, ctx)
        size = file.size if file.size >= 0 else storage.size(path)
        limit = corpus.max_line_bytes if self.cuts_long_lines else None
        # Every boundary aligned in one batch of ranged reads (and the split points in a second).
        wanted = list(range(shard.unit_bytes, size, shard.unit_bytes))
        capped = corpus.max_bytes is not None and corpus.max_bytes < size
        aligned = _align_all(path, wanted + ([corpus.max_bytes] if capped else []), size, limit,  # type: ignore[list-item]
                             shard.unit_bytes)
        if capped:
            size = aligned[corpus.max_bytes]  # type: ignore[index]
        bounds = sorted({0, size, *(min(aligned[b], size) for b in wanted if b < size)})
        pairs = list(zip(bounds, bounds[1:]))
        targets = [s + int((e - s) * (1 - frac)) for s, e in pairs]
        splits = _align_all(path, targets, size, limit, shard.unit_bytes) if 0 < frac < 1 else {}
        units = []
        for (s, e), t in zip(pairs, targets):
            if frac >= 1.0:  # validation text only (a validation source; an evaluation-only source)
                split_at = s
            else:
                split_at = e if frac == 0 else min(splits[t], e) if t < e else e
            units.append(WorkUnit(0, path, self.fmt, s, split_at, e, **ctx.common))  # type: ignore[arg-type]
        return units

    def plan_pack(self, files: list[CorpusFile], ctx: PlanContext) -> WorkUnit:
        corpus = ctx.corpus
        first = files[0]
        compression = detect(first.path)[1]  # type: ignore[index]
        streamed = dict(compression=compression, chunk_bytes=ctx.shard.unit_bytes, max_bytes=corpus.max_bytes,
                        max_rows=corpus.max_rows) if compression else {}
        return WorkUnit(0, first.path, first.fmt, 0, 0, sum(f.size for f in files), **ctx.common,
                        val_fraction=ctx.frac, members=tuple((f.path, f.size) for f in files), **streamed)

    # ---- reading ----
    def chunks(self, unit: WorkUnit, counts: Counts) -> Iterator[Chunk]:
        if not unit.streamed:
            yield self._packed_chunk(unit, counts) if unit.members else self._byte_range_chunk(unit, counts)
            return

        def decode(raw: bytes, offset: int, source: str | None = None) -> str:
            return decode_text(raw, unit, offset, "decompressed byte" if unit.compression else "byte", source)

        field, lists = unit.text_field, unit.text_lists
        if unit.members:  # small compressed files, streamed one after another (their caps apply per file)
            yield from packed_text_chunks([path for path, _ in unit.members], unit.compression, self.fmt,
                                          unit.chunk_bytes, unit.val_fraction, unit.max_bytes, unit.max_rows, decode,
                                          field, lists, counts)
            return
        yield from stream_text_chunks(unit.source, unit.compression, self.fmt, unit.chunk_bytes, unit.val_fraction,
                                      unit.max_bytes, decode, field, lists, counts, unit.max_rows)

    def _byte_range_chunk(self, unit: WorkUnit, counts: Counts) -> Chunk:
        """A plain byte range, read once: its train and validation parts.

        One ranged read of exactly the unit (on gs:// one GET: no info request, no readahead past
        the unit's end, which gcsfs's default file cache would add: up to 5 MiB per unit)."""
        raw = storage.read_ranges(unit.source, [unit.start], [unit.end])[0]
        cut = unit.split_at - unit.start
        parts = []
        for lo, data in ((unit.start, raw[:cut]), (unit.split_at, raw[cut:])):
            if not data:
                parts.append([])
                continue
            text = decode_text(data, unit, lo)
            parts.append(lines_of(self.range_texts(text, lo, unit, counts)))
            del text
        del raw  # one copy of a unit's text at a time (a unit may be one huge line)
        return Chunk(parts[0], parts[1])

    def _packed_chunk(self, unit: WorkUnit, counts: Counts) -> Chunk:
        """A packed unit's files, each read whole once, as one chunk: their texts in order, the
        validation part from (1 - val_fraction) of their characters (at a line or record boundary)."""
        items: list[tuple[int, int, str]] = []
        pos = 0
        for path, _size in unit.members:
            member = replace(unit, source=path, members=())
            raw = storage.read_bytes(path)  # one GET on object stores
            text = decode_text(raw, member, 0)
            del raw
            texts = self.file_texts(text, path, unit, counts)
            del text
            for t in texts:
                items.append((pos, len(t) + 1, t))
                pos += len(t) + 1
        train, validation = split_items(items, pos, unit.val_fraction) if items else ([], [])
        return Chunk(lines_of(train), lines_of(validation))

    def preflight(self, path: str, corpus, head: bytes | None, counts: Counts) -> None:
        """NUL bytes, and non-UTF-8 under encoding_errors=fail, in the first bytes (whole lines only:
        a character cut at the sniff's end is fine); compressed files are left to their stage."""
        if head is None:
            return
        lines = head[: head.rfind(b"\n") + 1]
        policy = corpus.encoding_errors if lines else "replace"
        text = decode_text(lines or head, WorkUnit(0, path, self.fmt, 0, 0, len(head),  # type: ignore[arg-type]
                                                   encoding_errors=policy), 0)
        self.sniff_records(text if lines else "", path, corpus, counts)

    def sniff_records(self, text: str, path: str, corpus, counts: Counts) -> None:
        """The records of a sniffed head, counted (JSON lines: whether they have the text field)."""


def _align_all(path: str, positions: list[int], size: int, max_line_bytes: int | None,
               unit_bytes: int) -> dict[int, int]:
    """`_align` of many positions of one file: one batch of small ranged reads (concurrent on
    object stores) instead of an open (an info request plus readahead) per boundary. A window
    without a usable newline falls back to `_align` (very long lines only)."""
    todo = sorted({p for p in positions if 0 < p < size})
    out = {p: (0 if p <= 0 else size) for p in positions if not 0 < p < size}
    if not todo:
        return out
    # Windows far smaller than a unit (lines are rarely longer; a longer one falls back below).
    span = max(_MIN_WINDOW, min(_ALIGN_WINDOW, unit_bytes // 16))
    windows = storage.read_ranges(path, [p - 1 for p in todo], [min(p - 1 + span, size) for p in todo])
    for p, window in zip(todo, windows):
        nl = window.find(b"\n")
        if nl >= 0 and (max_line_bytes is None or nl <= max_line_bytes):
            out[p] = min(p + nl, size)
        else:
            out[p] = _align(path, p, size, max_line_bytes)
    return out


def _align(path: str, pos: int, size: int, max_line_bytes: int | None = None) -> int:
    """The first line start at or after `pos` (or `size`): unit boundaries never cut a line, unless
    no line ends within `max_line_bytes` of `pos`: then right after the next whitespace (else at a
    character boundary), so that a unit stays about unit_bytes however long a line is."""
    if pos <= 0:
        return 0
    if pos >= size:
        return size
    with storage.open(path, "rb") as f:
        f.seek(pos - 1)
        offset = pos - 1
        while True:
            window = f.read(_ALIGN_WINDOW)
            if not window:
                return size
            nl = window.find(b"\n")
            if nl >= 0 and (max_line_bytes is None or offset + nl + 1 - pos <= max_line_bytes):
                return min(offset + nl + 1, size)
            offset += len(window)
            if max_line_bytes is not None and (nl >= 0 or offset - pos >= max_line_bytes):
                break
        f.seek(pos)
        window = f.read(_ALIGN_WINDOW)
    cuts = [i for i in (window.find(b" "), window.find(b"\t")) if i >= 0]
    if cuts:
        return min(pos + min(cuts) + 1, size)
    i = 0
    while i < len(window) and (window[i] & 0xC0) == 0x80:  # not inside a UTF-8 character
        i += 1
    return min(pos + i, size)
