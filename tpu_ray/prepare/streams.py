"""Streamed readers: compressed text / JSON lines and CSV/TSV, read front to back in chunks.

Why streamed and chunked: a compressed file cannot be entered at a byte offset, and a CSV record
may span lines, so neither can be cut into byte ranges like plain text. One such file is one work
unit (small compressed .txt/.jsonl files: several, streamed one after another), read once, and cut
while it streams into chunks of about `shard.unit_bytes` (each chunk is a train shard and a
validation shard): memory stays one chunk however large the file.

The chunk boundaries are those plain text gets: a chunk ends at the first line starting at or after
the next multiple of unit_bytes (in decompressed bytes), and its validation tail starts at the first
line at or after (1 - validation_fraction) of it. So `x.txt.gz` shards to the same bytes as `x.txt`.

Why not Ray Data's `read_json`/`read_csv`/`read_text`: their blocks depend on the cluster and the
readers' parallelism, and the shards must be byte-identical whatever the actor count and resumable
per committed unit; a chunk here depends only on the file.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import lzma
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tpu_ray.errors import UserError, first_line
from tpu_ray.prepare.formats import open_decompressed
from tpu_ray.prepare.records import text_of


@dataclass
class Chunk:
    """One chunk of a unit: its train lines, its validation lines."""

    train: list[str] = field(default_factory=list)
    validation: list[str] = field(default_factory=list)


@dataclass
class Counts:
    """What a reader skipped, by the text-field rule (records.py): null or missing fields; and, for
    JSON lines, whether any record had the field at all (none: a typo'd corpus.text_field)."""

    skipped: int = 0
    with_field: int = 0
    missing: int = 0
    first_missing: tuple[str, list[str]] | None = None  # (where, the fields that record has)

    def require_field(self, source: str, text_field: str) -> None:
        """Records without the field among none with it: not data to skip, a wrong field name."""
        if self.missing and not self.with_field and self.first_missing:
            where, keys = self.first_missing
            raise UserError(f"{source}: {where}: record has no field {text_field!r} (fields: {', '.join(keys)}); "
                            f"set corpus.text_field to the field that holds the text")


TYPO_RECORDS = 100  # this many records without the field, and none with it: stop early, it is a typo


def chunked(items: Iterable[tuple[int, int, Any]], chunk_bytes: int, frac: float,
            limit: int | None = None) -> Iterator[tuple[list, list]]:
    """Group (position, nbytes, payload) items into (train, validation) payload lists per chunk.

    `position` is where the item starts (decompressed bytes, or text bytes for tables); items at
    or past `limit` (corpus.max_bytes) are not read. See the module docstring for the boundaries.
    """
    chunk: list[tuple[int, int, Any]] = []
    cut = 0
    for pos, n, payload in items:
        if limit is not None and pos >= limit:
            break
        if chunk and pos >= cut:
            yield split_items(chunk, pos, frac)
            chunk = []
        if not chunk:
            cut = (pos // chunk_bytes + 1) * chunk_bytes
        chunk.append((pos, n, payload))
    if chunk:
        yield split_items(chunk, chunk[-1][0] + chunk[-1][1], frac)


def split_items(chunk: list[tuple[int, int, Any]], end: int, frac: float) -> tuple[list, list]:
    """(train, validation) payloads of one chunk: validation from the first item at or past
    (1 - frac) of the chunk's span."""
    start = chunk[0][0]
    if frac <= 0:
        k = len(chunk)
    elif frac >= 1:
        k = 0
    else:
        target = start + int((end - start) * (1 - frac))
        k = next((i for i, item in enumerate(chunk) if item[0] >= target), len(chunk))
    return [p for _, _, p in chunk[:k]], [p for _, _, p in chunk[k:]]


# Errors of a damaged or cut compressed stream, by library: named in one line, never trained around.
def _stream_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [EOFError, zlib.error, lzma.LZMAError, OSError]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:  # pragma: no cover - zstandard is a dependency
        pass
    return tuple(errors)


def _damaged(path: str, where: str, exc: BaseException, compression: str | None) -> UserError:
    what = f"{compression} stream" if compression else "file"
    return UserError(f"{path}: {where}: {what} is damaged or cut short ({first_line(exc)}); re-download or "
                     f"re-compress the file")


def raw_lines(path: str, compression: str | None, whole: bool = False) -> Iterator[tuple[int, int, tuple[int, bytes]]]:
    """(offset, nbytes, (line number, raw line, offset)) for every line of a (decompressed) file,
    streamed (`whole`: the stored bytes fetched in one read, see open_decompressed)."""
    line_no = 0
    offset = 0
    try:
        with open_decompressed(path, compression, whole) as f:
            for line in f:
                line_no += 1
                yield offset, len(line), (line_no, line, offset)
                offset += len(line)
    except UserError:
        raise
    except _stream_errors() as exc:
        raise _damaged(path, f"after line {line_no}", exc, compression) from None


def csv_records(path: str, compression: str | None, delimiter: str, text_field: str, errors: str,
                counts: Counts) -> Iterator[tuple[int, int, str]]:
    """(text position, nbytes, text) of every record of a CSV/TSV file with a header row, streamed.

    Python's csv module (quoted fields may span lines; it knows each record's line number for the
    errors); the header must name `text_field`. A row too short to reach it is skipped and counted.
    CSV cells are always strings: no other type can reach the tokenizer.
    """
    csv.field_size_limit(1 << 30)  # the default (128 KiB) refuses long documents
    pos = 0
    line = 0
    try:
        with open_decompressed(path, compression) as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace" if errors == "replace" else "strict",
                                    newline="")
            reader = csv.reader(text, delimiter=delimiter)
            header = next(reader, None)
            if header is None:
                return
            if text_field not in header:
                shown = ", ".join(repr(h) for h in header[:8])
                raise UserError(f"{path}: line 1: the header row has no column {text_field!r} (it has {shown}); "
                                f"a CSV/TSV needs a header naming its columns: add one, or set corpus.text_field "
                                f"to the column that holds the text")
            col = header.index(text_field)
            for row in reader:
                line = reader.line_num
                if col >= len(row):
                    counts.skipped += 1
                    continue
                value = row[col]
                n = len(value.encode("utf-8"))
                yield pos, n, value
                pos += n
    except UserError:
        raise
    except csv.Error as exc:
        raise UserError(f"{path}: line {line + 1}: not a valid CSV/TSV record ({first_line(exc)}); fix the "
                        f"file") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: near line {line + 1}: not UTF-8 ({exc.reason}); fix the file or set "
                        f"corpus.encoding_errors=replace") from None
    except _stream_errors() as exc:
        raise _damaged(path, f"after line {line}", exc, compression) from None


def json_texts(lines: Iterable[tuple[str, bytes | str]], source: str, text_field: str, lists: str,
               counts: Counts) -> list[str]:
    """The text field of every JSON line (`where` names each record); the text-field rule applies.

    Records none of which has the field at all are a typo'd `corpus.text_field`, not data to skip:
    an error naming the fields the first record has (`counts.require_field`, at the end of a unit,
    or as soon as TYPO_RECORDS records in a row lack it).
    """
    out: list[str] = []
    for where, line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise UserError(f"{source}: {where}: not a JSON line ({reason}); fix the record or use a .txt "
                            f"file") from None
        if not isinstance(record, dict):
            raise UserError(f"{source}: {where}: a JSON {type(record).__name__}, not an object with a "
                            f"{text_field!r} field; write one JSON object per line")
        if text_field not in record:
            counts.missing += 1
            counts.skipped += 1
            if counts.first_missing is None:
                counts.first_missing = (where, list(record)[:8])
            if counts.missing >= TYPO_RECORDS:
                counts.require_field(source, text_field)
            continue
        counts.with_field += 1
        value = text_of(record[text_field], source, where, text_field, lists)
        if value is None:
            counts.skipped += 1
        else:
            out.append(value)
    return out


def lines_of(texts: Iterable[str]) -> list[str]:
    """Texts as the tokenizer's lines: split at newlines, stripped, empty ones left out."""
    return [s for s in (line.strip() for t in texts for line in t.split("\n")) if s]


def stream_text_chunks(path: str, compression: str | None, fmt: str, chunk_bytes: int, frac: float,
                       limit: int | None, decode: Callable[[bytes, int], str], text_field: str, lists: str,
                       counts: Counts, max_rows: int | None = None) -> Iterator[Chunk]:
    """Chunks of a streamed .txt/.jsonl file (compressed or not): lines of each part, one chunk alive;
    its first `max_rows` lines (records) only, when given."""
    lines = raw_lines(path, compression)
    if max_rows is not None:
        lines = itertools.islice(lines, max_rows)
    for train, validation in chunked(lines, chunk_bytes, frac, limit):
        parts = []
        for items in (train, validation):
            if fmt == "jsonl":
                texts = json_texts(((f"line {no}", raw) for no, raw, _ in items), path, text_field, lists, counts)
                parts.append(lines_of(texts))
            else:
                if not items:
                    parts.append([])
                    continue
                # One decode per part, as a plain-text unit gets (the same NUL and UTF-8 checks).
                parts.append(lines_of([decode(b"".join(raw for _, raw, _ in items), items[0][2])]))
        yield Chunk(parts[0], parts[1])


def packed_text_chunks(paths: list[str], compression: str | None, fmt: str, chunk_bytes: int, frac: float,
                       limit: int | None, max_rows: int | None, decode: Callable[[bytes, int, str], str],
                       text_field: str, lists: str, counts: Counts) -> Iterator[Chunk]:
    """Chunks of a packed unit of small compressed .txt/.jsonl files: their lines as one stream, one
    chunk alive (so memory is a chunk, not the files' decompressed size, unknown when they were packed).

    The stream is the text a plain .txt of the files would hold (a JSON line's text field, split at
    its newlines; a line end at each file's end), at that .txt's byte positions: `chunked` cuts it
    where that file's units would end, so the pack shards like it. Each file keeps its own caps
    (`max_rows` records, `limit` decompressed bytes) and its errors name it and its line.
    """
    for train, validation in chunked(_member_lines(paths, compression, fmt, limit, max_rows, decode, text_field,
                                                   lists, counts), chunk_bytes, frac):
        yield Chunk(lines_of(train), lines_of(validation))


def _member_lines(paths: list[str], compression: str | None, fmt: str, limit: int | None, max_rows: int | None,
                  decode: Callable[[bytes, int, str], str], text_field: str, lists: str,
                  counts: Counts) -> Iterator[tuple[int, int, str]]:
    """(text position, nbytes, line) of every text line of the files, one file after another."""
    pos = 0
    for path in paths:
        lines = raw_lines(path, compression, whole=True)  # small by planning: one GET, no info request
        if max_rows is not None:
            lines = itertools.islice(lines, max_rows)
        for offset, _, (no, raw, _) in lines:
            if limit is not None and offset >= limit:
                break
            if fmt != "jsonl":
                n = len(raw) + (not raw.endswith(b"\n"))
                yield pos, n, decode(raw, offset, path).removesuffix("\n")
                pos += n
                continue
            for text in json_texts([(f"line {no}", raw)], path, text_field, lists, counts):
                for line in text.split("\n"):
                    n = (len(line) if line.isascii() else len(line.encode("utf-8", "replace"))) + 1
                    yield pos, n, line
                    pos += n
        if fmt == "jsonl":
            counts.require_field(path, text_field)  # no record of the file had it so far: a typo, named here
