"""What every corpus reader is and gets: the work unit, a listed file, the planning context, the interface.

Why one interface: the planner (corpus.py) plans a listing file by file and reads a unit without
knowing any format; each format is one class (one module of this package) that plans units from a
file of its own, reads one unit's text as chunks, and describes itself. Adding a format is one file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, ClassVar

from tpu_ray.errors import UserError
from tpu_ray.prepare.formats import Format, byte_order_mark
from tpu_ray.prepare.streams import Chunk, Counts

if TYPE_CHECKING:  # pragma: no cover
    from tpu_ray.config import CorpusConfig, ShardConfig


@dataclass(frozen=True)
class WorkUnit:
    """A deterministic slice of the corpus.

    Byte-range units (chunk_bytes == 0): [start, split_at) is train, [split_at, end) validation.
    Streamed units (chunk_bytes > 0): start/end are bytes of the file (streams), row groups
    (parquet) or rows (datasets), read as chunks of about chunk_bytes of text, each split
    train/validation at (1 - val_fraction); each chunk is its own shard (`.<part>` in its name).
    """

    index: int
    source: str
    fmt: Format
    start: int
    split_at: int
    end: int
    hf_config: str | None = None
    hf_split: str = "train"
    text_field: str = "text"
    encoding_errors: str = "replace"
    # Added with the streamed formats; left out of the plan digest at their defaults (see key()).
    compression: str | None = None
    chunk_bytes: int = 0
    val_fraction: float = 0.0
    max_bytes: int | None = None
    text_lists: str = "error"
    # A packed unit: several small files of one format and compression, as (path, size) in listing
    # order; `source` is the first, `end` their total (stored) size. Plain ones are read whole as one
    # chunk split at (1 - val_fraction); compressed ones are streamed one after another (chunk_bytes > 0).
    members: tuple[tuple[str, int], ...] = ()
    max_rows: int | None = None  # streamed units: records (lines, rows) this unit may read at most
    bad_records: str = "fail"  # corpus.bad_records: "skip" lists and skips records that cannot be read

    @property
    def streamed(self) -> bool:
        return self.chunk_bytes > 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> WorkUnit:
        return cls(**{**d, "members": tuple(tuple(m) for m in d.get("members", ()))})

    def key(self) -> tuple:
        """What identifies the unit in the plan digest: the fields of a unit before streamed formats,
        plus any later field that is not at its default (so existing shard runs still resume)."""
        values = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _LATER_FIELDS and value == f.default:
                continue
            values.append([f.name, value] if f.name in _LATER_FIELDS else value)
        return tuple(values)


_LATER_FIELDS = {"compression", "chunk_bytes", "val_fraction", "max_bytes", "text_lists", "members", "max_rows",
                 "bad_records"}


@dataclass(frozen=True)
class CorpusFile:
    """A corpus file as one listing saw it: its size and version feed the plan, no request per file."""

    path: str
    fmt: Format
    size: int
    version: str = ""


@dataclass(frozen=True)
class PlanContext:
    """What planning one source needs: its settings, the unit size, its validation fraction, and the
    config field that names it in errors."""

    corpus: CorpusConfig
    shard: ShardConfig
    run_dir: str
    frac: float
    field: str = "corpus.source"

    @property
    def common(self) -> dict:
        """The unit fields every reader copies from the corpus settings."""
        c = self.corpus
        return dict(hf_config=c.hf_config, hf_split=c.hf_split, text_field=c.text_field,
                    encoding_errors=c.encoding_errors, text_lists=c.text_lists, bad_records=c.bad_records)

    @property
    def stream(self) -> dict:
        """The unit fields of a streamed unit: chunks of a unit of text, each split by the fraction."""
        return dict(chunk_bytes=self.shard.unit_bytes, val_fraction=self.frac)

    def first_rows(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Row ranges of a dataset cut to its first corpus.max_rows rows."""
        if self.corpus.max_rows is None:
            return ranges
        return [(s, min(e, self.corpus.max_rows)) for s, e in ranges if s < self.corpus.max_rows]


class Reader:
    """One corpus format: plans units from a listed file, reads one unit's text, describes itself.

    Subclasses set `fmt` (the WorkUnit.fmt they read), `description` (what a unit of it is) and
    `suffixes` (file names they read; readers.detect), and register with `@register`.
    """

    fmt: ClassVar[str]
    description: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]] = ()
    compressible: ClassVar[bool] = False  # its files may be .gz/.zst/...: streamed
    packable: ClassVar[bool] = False  # small files of it are packed several to a unit (plan_pack)
    cacheable: ClassVar[bool] = True  # its plan is stored in RUN/plan.json (False: planned every time)
    sized: ClassVar[bool] = True  # a listed entry has a stored size (False: a directory, e.g. save_to_disk)

    def describe(self) -> str:
        return self.description

    def where(self, unit: WorkUnit) -> str:
        """Where a (single-file) unit of this format is, for the user: `file bytes a-b` or
        `file (whole, streamed)`; table readers name row groups or rows."""
        if unit.streamed:
            return f"{unit.source} (whole, streamed)"
        return f"{unit.source} bytes {unit.start}-{unit.end}"

    def warm(self) -> None:
        """Import what reading a unit needs, before an actor's read counter starts (shards.py)."""

    def plan(self, file: CorpusFile, ctx: PlanContext) -> list[WorkUnit]:
        """The units of one listed file, in order (index 0: the planner numbers them)."""
        raise NotImplementedError

    def plan_pack(self, files: list[CorpusFile], ctx: PlanContext) -> WorkUnit:
        """One unit of several small files (packable readers only)."""
        raise NotImplementedError(f"{self.fmt} files are not packed")

    def chunks(self, unit: WorkUnit, counts: Counts) -> Iterator[Chunk]:
        """The unit's chunks, front to back, one alive at a time; `counts` gathers skipped records."""
        raise NotImplementedError

    def preflight(self, path: str, corpus: CorpusConfig, head: bytes | None, counts: Counts) -> None:
        """A cheap check of one file before a stage writes anything (preflight.py); `head` is the
        file's first bytes where the reader asked for them (`sniffs`); `counts` gathers the records
        it saw (for the typo'd-text-field warning)."""

    sniffs: ClassVar[bool] = False  # preflight wants the first bytes of uncompressed files


def decode_text(raw: bytes, unit: WorkUnit, offset: int, what: str = "byte", source: str | None = None) -> str:
    """`raw` as text, or a one-line error naming `source` (default: the unit's file) and the byte."""
    source = source or unit.source
    if offset == 0:  # a file's first bytes: a byte-order mark is never text (a UTF-16/32 one: refused)
        raw = raw[byte_order_mark(raw[:4], source):]
    if b"\x00" in raw:
        at = offset + raw.index(b"\x00")
        raise UserError(f"{source}: {what} {at}: NUL byte, this looks like a binary file, not text; "
                        f"point corpus.source at text files")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if unit.encoding_errors == "replace":
            return raw.decode("utf-8", errors="replace")
        raise UserError(f"{source}: {what} {offset + exc.start}: not UTF-8 ({exc.reason}); fix the file "
                        f"or set corpus.encoding_errors=replace") from None


class SourceReader:
    """A source given by name rather than by path (`builtin:...`, `hf:NAME`): it becomes a listing of
    files the format readers plan, or (None) is planned by `plan` itself, every time."""

    def claims(self, source: str) -> bool:
        raise NotImplementedError

    def listing(self, source: str, run_dir: str, field: str) -> list[CorpusFile] | None:
        raise NotImplementedError

    def plan(self, source: str, ctx: PlanContext) -> tuple[list[WorkUnit], list[CorpusFile]]:
        """Units planned here, or files for the format readers to plan (one of the two is empty)."""
        raise NotImplementedError
