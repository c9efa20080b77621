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
import logging
import lzma
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tpu_ray.errors import UserError, first_line
from tpu_ray.prepare.formats import byte_order_mark, open_decompressed
from tpu_ray.prepare.records import text_of

log = logging.getLogger("tpu_ray.prepare.corpus")


@dataclass
class Chunk:
    """One chunk of a unit: its train lines, its validation lines."""

    train: list[str] = field(default_factory=list)
    validation: list[str] = field(default_factory=list)


@dataclass
class Counts:
    """What a reader skipped, by the text-field rule (records.py): null or missing fields, wherever
    they stand (so the shard pass can account for every one); whether any record had the field at all (none in the whole corpus: a
    typo'd corpus.text_field, refused once by `require_field` over every unit's counts); and, under
    corpus.bad_records=skip, the records that could not be read (`bad`: where and why)."""

    skipped: int = 0
    with_field: int = 0
    missing: int = 0
    first_missing: tuple[str, list[str]] | None = None  # ("file: where", the fields that record has)
    records: int = 0  # records read (JSON lines, CSV rows, table rows): the bad-record fraction's base
    skip_bad: bool = False  # corpus.bad_records=skip: a record that cannot be read is listed, not fatal
    bad: list[dict] = field(default_factory=list)  # {"file", "where", "reason"} of each skipped bad record
    by_kind: dict[str, int] = field(default_factory=dict)  # skipped records by file kind (iter_chunks)
    warned: bool = False  # the typo'd-field warning was given
    max_record_bytes: int | None = None  # corpus.max_line_bytes when sharding: a longer JSON record is bad

    def missing_field(self, source: str, where: str, keys: list[str], text_field: str) -> None:
        """Count a record without the field; warn (once) when a file's first records all lack it."""
        self.missing += 1
        self.skipped += 1
        if self.first_missing is None:
            self.first_missing = (f"{source}: {where}", keys[:8])
        if self.missing >= TYPO_RECORDS and not self.with_field and not self.warned:
            self.warned = True
            log.warning("%s: the first %d records read have no field %r (fields: %s); they are skipped and counted; "
                        "if corpus.text_field is wrong, stop and set it (a corpus where no record has it is "
                        "refused at the end)", source, self.missing, text_field, ", ".join(keys[:8]))

    def bad_record(self, source: str, where: str, reason: str, error: str) -> None:
        """A record that cannot be read: listed and skipped under bad_records=skip, else `error`."""
        if not self.skip_bad:
            raise UserError(error)
        self.bad.append({"file": source, "where": where, "reason": reason})

    def require_field(self, source: str, text_field: str) -> None:
        """Records without the field among none with it: not data to skip, a wrong field name."""
        require_field([self], text_field)


def require_field(counts: Iterable[Counts], text_field: str) -> None:
    """A corpus (every unit's counts) in which records lack the field and none has it: a wrong field
    name, refused once naming the first such record and the fields it has."""
    counts = list(counts)
    if any(c.with_field for c in counts) or not any(c.missing for c in counts):
        return
    where, keys = next(c.first_missing for c in counts if c.first_missing)  # type: ignore[misc]
    missing = sum(c.missing for c in counts)
    raise UserError(f"{where}: record has no field {text_field!r} (fields: {', '.join(keys)}); set corpus.text_field "
                    f"to the field that holds the text (no record of the corpus has it: {missing:,} read)")


TYPO_RECORDS = 100  # this many records without the field, and none with it: warn that it may be a typo


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
                n = len(line)
                if line_no == 1:  # a byte-order mark is never text (a UTF-16/32 one: refused)
                    line = line[byte_order_mark(line[:4], path):]
                yield offset, n, (line_no, line, offset)
                offset += n
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
            head = raw.read(4)  # a byte-order mark is never text (a UTF-16/32 one: refused)
            body = io.BufferedReader(_Prefixed(head[byte_order_mark(head, path):], raw), 1 << 20)
            text = io.TextIOWrapper(body, encoding="utf-8", errors="replace" if errors == "replace" else "strict",
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
                counts.records += 1
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


class _Prefixed(io.RawIOBase):
    """`head`, then the rest of `raw`: a stream whose first bytes were read to look at them."""

    def __init__(self, head: bytes, raw: Any):
        self._head, self._raw = head, raw

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self._head:
            n = min(len(b), len(self._head))
            b[:n], self._head = self._head[:n], self._head[n:]
            return n
        data = self._raw.read(len(b))
        b[:len(data)] = data
        return len(data)


def json_texts(lines: Iterable[tuple[str, bytes | str]], source: str, text_field: str, lists: str,
               counts: Counts) -> list[str]:
    """The text field of every JSON line (`where` names each record); the text-field rule applies.

    A record without the field is skipped and counted wherever it stands (a warning when the first
    TYPO_RECORDS read all lack it); a corpus where none has it is a typo'd `corpus.text_field`,
    refused once over every unit's counts (`require_field`). A record that cannot be read (not
    JSON, not an object, a field that is not text) fails, or is listed under bad_records=skip.
    """
    out: list[str] = []
    for where, line in lines:
        if not line.strip():
            continue
        counts.records += 1
        limit = counts.max_record_bytes
        if limit and len(line) > limit // 4 and (size := len(line.encode() if isinstance(line, str) else line)) > limit:
            counts.bad_record(source, where, f"a record of {size} bytes, over corpus.max_line_bytes={limit}",
                              f"{source}: {where}: a record of {size} bytes, over corpus.max_line_bytes={limit} (a "
                              f"record is never cut); raise corpus.max_line_bytes to read it, or set "
                              f"corpus.bad_records=skip to skip and list it")
            continue
        if isinstance(line, str) and line.startswith("\ufeff"):  # a byte-order mark is never text
            line = line[1:]
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            counts.bad_record(source, where, f"not a JSON line ({reason})",
                              f"{source}: {where}: not a JSON line ({reason}); fix the record, use a .txt file, "
                              f"or set corpus.bad_records=skip to skip and list such records")
            continue
        if not isinstance(record, dict):
            counts.bad_record(source, where, f"a JSON {type(record).__name__}, not an object",
                              f"{source}: {where}: a JSON {type(record).__name__}, not an object with a "
                              f"{text_field!r} field; write one JSON object per line")
            continue
        if text_field not in record or record[text_field] is None:
            if text_field in record:  # null: the field is there, its record has no text
                counts.with_field += 1
                counts.skipped += 1
            else:
                counts.missing_field(source, where, list(record), text_field)
            continue
        counts.with_field += 1
        try:
            value = text_of(record[text_field], source, where, text_field, lists)
        except UserError as exc:
            if not counts.skip_bad:
                raise
            counts.bad.append({"file": source, "where": where, "reason": str(exc).split("; ")[0].split(": ")[-1]})
            continue
        out.append(value)  # type: ignore[arg-type]
    return out


def lines_of(texts: Iterable[str]) -> list[str]:
    """Texts as the tokenizer's lines: split at newlines, stripped, empty ones left out; a byte-order
    mark opening a line is not text (kept, it became a vocabulary token)."""
    out = [s for s in (line.strip() for t in texts for line in t.split("\n")) if s]
    if any(s[0] == "\ufeff" for s in out):
        out = [x for s in out if (x := s.lstrip("\ufeff").strip())]
    return out


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
