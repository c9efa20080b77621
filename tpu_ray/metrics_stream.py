"""The metrics stream, written and read: JSON lines in `<run_dir>/metrics.jsonl`, or one file per
writer under `<run_dir>/metrics/` (gs:// runs, and run directories on a filesystem whose appends
from two hosts can tear or overwrite each other: see `MetricsWriter`), one record per line.

Ray jobs return nothing to the submitter, so the run directory is the channel: the trainer, the
pipeline, recovery and fine-tuning write here; the Python API (`load_metrics`), `tpu-ray report`,
job handles and resumed runs read it, live or after the fact. It sits below every stage (it needs
only storage), so each of them can write and read the stream without importing another stage.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from tpu_ray import storage
from tpu_ray.errors import UserError
from tpu_ray.redact import redact
from tpu_ray.rundir import METRICS_DIR, METRICS_FILE

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("tpu_ray.report")  # what reading finds
write_log = logging.getLogger("tpu_ray.train.metrics")  # what writing meets

# The record kinds a mirror (the trainer's TensorBoard) also receives.
MIRRORED = ("train", "eval", "eval_source")


class Mirror(Protocol):
    """Where records are also written: the trainer's TensorBoard (train/tensorboard.py), experiment
    trackers (tpu_ray/tracking), the progress line (tpu_ray/progress.py), Ray's gauges. A mirror
    receives the kinds in its `kinds` attribute (MIRRORED when it has none); one that raises is
    warned about and dropped, never allowed to stop the run (see MetricsWriter._to_mirrors)."""

    def write(self, record: dict) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


# ----------------------------------------------------------------------------------------- writing

SEGMENT_BYTES = 1 << 20


def writer_id() -> str:
    """Unique per writer and sortable by start time: `<ms since epoch>-<host>-<pid>-<random>`."""
    import os
    import socket
    import uuid

    host = "".join(c if c.isalnum() or c in "-." else "_" for c in socket.gethostname())[:40]
    return f"{int(time.time() * 1000):013d}-{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


# Filesystems whose appends from two hosts can interleave inside a record or overwrite each other:
# NFS does not honour O_APPEND across clients (each computes the end of the file from its cached
# size), and SMB, 9p and FUSE mounts (gcsfuse, sshfs) promise no more. Matched by type or prefix.
APPEND_UNSAFE_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse")


def _unescape_mount(field: str) -> str:
    """A /proc/mounts field: the kernel writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_type(path: str, mounts: str) -> str | None:
    """The type of the filesystem holding local `path`, by the longest mount point above it in
    `mounts` (the text of /proc/self/mounts); None if no mount matches."""
    real = os.path.realpath(path)  # links resolved as far as the path exists
    best, kind = -1, None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape_mount(fields[1])
        if real == point or real.startswith(point.rstrip("/") + "/"):
            if len(point) > best:
                best, kind = len(point), fields[2]
    return kind


def appends_unsafe(path: str, mounts: str | None = None) -> bool:
    """True if local `path` is on a filesystem in APPEND_UNSAFE_FS (`mounts`: /proc/self/mounts's
    text, read when None; a system without it says False)."""
    if mounts is None:
        try:
            with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
                mounts = f.read()
        except OSError:
            return False
    kind = filesystem_type(path, mounts) or ""
    return any(kind == t or kind.startswith(t + ".") for t in APPEND_UNSAFE_FS)


def one_file_per_writer(run_dir: str, shared: bool = False) -> bool:
    """Whether the run's writers each write a file of their own under `metrics/` rather than append
    to `metrics.jsonl`: on gs:// (objects cannot be appended to); when the run directory is declared
    shared between hosts (`shared`: ray.shared_filesystem); on a filesystem whose appends are not
    atomic across hosts (appends_unsafe); and once `metrics/` exists there (an earlier writer of the
    run chose it, so every later one follows, whatever it knows of the config)."""
    if storage.is_remote(run_dir) or shared:
        return True
    local = storage.filesystem(run_dir)[1]  # a file:// URL as a path
    return os.path.isdir(os.path.join(local, METRICS_DIR)) or appends_unsafe(local)


class MetricsWriter:
    """Appends records. Records from different processes never share an appended file where
    appends are not atomic across hosts (`one_file_per_writer`): there every writer owns its file,
    `metrics/<writer id>.jsonl`, appended and flushed per record by it alone. Otherwise (a local
    disk: one host, whose appends are atomic) records are appended to `metrics.jsonl`, each with
    one write. Object stores cannot append, and a read-modify-write of one shared object loses
    records when two writers overlap (the pipeline's and the trainer's, or a trainer restarted after
    a lost node beside the old one's last upload). So on gs:// every writer owns its objects,
    `metrics/<writer id>-<n>.jsonl`, and rewrites only its own current object (rolled over at
    SEGMENT_BYTES, so each upload stays small); nobody reads before writing. `load_metrics` merges
    `metrics.jsonl` and all of these by time. New records are uploaded at most every
    `remote_every_s` (at once for evaluations and events), so a crash loses at most the records of
    the current interval. An upload that fails during training is retried at the next one instead
    of ending a long run; `flush()` itself raises.

    `shared`: the run directory is one mount shared by several hosts (ray.shared_filesystem), so
    this writer and every later one of the run write files of their own.
    """

    def __init__(self, run_dir: str, remote_every_s: float = 30.0,
                 mirror: Callable[[str], Mirror] | None = None, shared: bool = False,
                 mirrors: Sequence[Mirror] = ()):
        self.run_dir = run_dir
        self._mirror_factory = mirror  # train/eval records also go there (the trainer's TensorBoard)
        self._tb: Mirror | None = None
        self.mirrors: list[Mirror] = list(mirrors)  # trackers, progress, gauges: see Mirror
        self.path = storage.join(run_dir, METRICS_FILE)
        self.remote = storage.is_remote(self.path)
        self._pending: list[str] = []
        self._every = remote_every_s
        self._last_upload = 0.0
        self._writer_id = writer_id()
        if not self.remote and one_file_per_writer(run_dir, shared):
            # The directory first, so that writers started later (the trainer on another host,
            # fine-tuning) see it and take files of their own too.
            storage.makedirs(storage.join(run_dir, METRICS_DIR))
            self.path = storage.join(run_dir, METRICS_DIR, f"{self._writer_id}.jsonl")
        self._segment = 0
        self._segment_lines: list[str] = []  # this writer's records in its current object
        self._segment_bytes = 0

    def write(self, kind: str, **fields: Any) -> dict:
        record = {"kind": kind, "time": time.time(), **{k: _clean(v) for k, v in fields.items()}}
        if kind in MIRRORED and self._mirror_factory is not None:
            self._mirror().write(record)
        line = redact(json.dumps(record)) + "\n"  # an error naming a URL keeps no password
        self._append(kind, line)
        self._to_mirrors(record)
        return record

    def add_mirror(self, mirror: Mirror) -> None:
        self.mirrors.append(mirror)

    def _to_mirrors(self, record: dict) -> None:
        """Each mirror's kinds; then the events mirrors asked to record (a tracker that gave up says
        so in the stream). A mirror that raises is dropped with a warning: figures elsewhere never
        stop a run whose source of truth is this stream."""
        for m in list(self.mirrors):
            if record["kind"] not in getattr(m, "kinds", MIRRORED):
                continue
            try:
                m.write(record)
            except Exception as exc:  # noqa: BLE001 - any failure of an optional sink
                write_log.warning("%s failed and is dropped; the run goes on: %s", type(m).__name__, exc)
                self.mirrors.remove(m)
        self._record_mirror_events()

    def _record_mirror_events(self) -> None:
        for m in self.mirrors:
            take = getattr(m, "take_events", None)
            for fields in take() if take else []:
                line = redact(json.dumps({"kind": "event", "time": time.time(), **fields})) + "\n"
                self._append("event", line)

    def _append(self, kind: str, line: str) -> None:
        if self.remote:
            self._pending.append(line)
            if time.monotonic() - self._last_upload >= self._every or kind != "train":
                try:
                    self.flush()
                except storage.StorageError as exc:
                    write_log.warning("metrics upload failed, retried with the next records: %s", exc)
                    self._last_upload = time.monotonic()
        else:
            storage.append_text_local(self.path, line)  # never through a link planted in its place

    def flush(self) -> None:
        """Upload held records (gs://) and TensorBoard events."""
        if self.remote and self._pending:
            if self._segment_bytes >= SEGMENT_BYTES:  # the current object is full: start the next
                self._segment += 1
                self._segment_lines, self._segment_bytes = [], 0
            lines = self._segment_lines + self._pending
            storage.atomic_write_text(self._object_path(), "".join(lines))
            self._segment_lines = lines
            self._segment_bytes = sum(map(len, lines))
            self._pending.clear()
            self._last_upload = time.monotonic()
        if self._tb is not None:
            self._tb.flush()

    def _object_path(self) -> str:
        return storage.join(self.run_dir, METRICS_DIR, f"{self._writer_id}-{self._segment:04d}.jsonl")

    def close(self) -> None:
        """Close the mirrors (a tracker sends what it holds), record what they report, flush, and
        release TensorBoard's writer thread and staging directory."""
        for m in self.mirrors:
            try:
                m.close()
            except Exception as exc:  # noqa: BLE001 - an optional sink never fails the run's end
                write_log.warning("%s failed to close: %s", type(m).__name__, exc)
        self._record_mirror_events()
        self.mirrors = []
        self.flush()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def _mirror(self) -> Mirror:
        if self._tb is None:  # made on first use: a writer of events only never starts one
            self._tb = self._mirror_factory(self.run_dir)
        return self._tb

    def event(self, event: str, **fields: Any) -> dict:
        return self.write("event", event=event, **fields)


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# ----------------------------------------------------------------------------------------- reading

BASE_COLUMNS = ["kind", "step", "time"]
KIND_COLUMNS = {
    "train": ["elapsed_s", "loss", "accuracy", "learning_rate", "step_time_s", "samples_per_s",
              "tokens_per_s", "mfu", "train_traces", "input_wait_s", "seq_len"],
    "eval": ["eval_loss", "eval_accuracy", "perplexity", "bits_per_byte", "eval_tokens", "eval_set", "eval_mask_prob",
             "eval_time_s"],
    "eval_source": ["source", "eval_loss", "eval_accuracy", "perplexity", "bits_per_byte", "eval_tokens",
                    "eval_samples", "eval_set", "eval_mask_prob"],
    # `tpu-ray eval` (pooled, and per source with `source`): apart from the training curve
    "eval_rerun": ["source", "eval_loss", "eval_accuracy", "perplexity", "bits_per_byte", "eval_tokens",
                   "eval_set", "eval_mask_prob"],
    "event": ["event", "stage", "seconds"],
    # `tpu-ray finetune`: one record per (seed, learning rate) trial; metric columns follow the task
    "downstream": ["task", "task_hash", "seed", "learning_rate", "status", "metric", "error"],
}
TEXT_COLUMNS = {"kind", "event", "stage", "source", "eval_set", "task", "task_hash", "status", "metric", "error"}


def _check_run_dir(run_dir: str) -> bool:
    """True if the run directory exists; a file in its place, or a store that cannot be read
    (missing bucket, access denied: storage's one-line errors), is a UserError."""
    try:
        found = storage.exists(run_dir)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read run directory {run_dir}: {exc}") from None
    if found and not storage.isdir(run_dir):
        raise UserError(f"{run_dir}: is a file, not a run directory; pass the run's --output-dir")
    return found


def _read_text(path: str) -> str | None:
    """The file's text (undecodable bytes replaced: a live writer may be mid-character), or None
    if it does not exist."""
    try:
        return storage.read_bytes(path).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None


def read_records(run_dir: str) -> list[dict]:
    """Every record of the run's metrics stream as written (all writers, unsorted, no dedup)."""
    return _read_metrics(run_dir)


def _read_metrics(run_dir: str) -> list[dict]:
    """Records of `metrics.jsonl` and of every writer's `metrics/*.jsonl` file or object (gs:// runs
    and shared run directories write one per writer instead of appending to one file; see
    MetricsWriter). A run directory of an older version holds `metrics.jsonl` alone."""
    path = storage.join(run_dir, METRICS_FILE)
    text = _read_text(path)
    records = _parse_lines(text, path) if text else []
    fs, root = storage.filesystem(storage.join(run_dir, METRICS_DIR))
    try:
        fs.invalidate_cache(root)  # a live run adds objects: never answer from a cached listing
        names = sorted(fs.glob(root.rstrip("/") + "/*.jsonl"))
    except FileNotFoundError:
        names = []
    for name in names:
        obj = storage.join(storage.join(run_dir, METRICS_DIR), name.rsplit("/", 1)[-1])
        text = _read_text(obj)
        records += _parse_lines(text, obj) if text else []
    return records


def _parse_lines(text: str, path: str) -> list[dict]:
    lines = text.split("\n")
    records = []
    for i, line in enumerate(lines):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            is_last = all(not rest.strip() for rest in lines[i + 1:])
            if not is_last:  # the writer only ever leaves the *last* line unfinished
                log.warning("%s line %d is not JSON: skipped", path, i + 1)
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def _documented(kind: str | None) -> list[str]:
    """The columns load_metrics always returns for `kind` (all kinds' for None), as docs/jobs.md lists."""
    kinds = [kind] if kind else list(KIND_COLUMNS)
    return list(dict.fromkeys(BASE_COLUMNS + [c for k in kinds for c in KIND_COLUMNS.get(k, [])]))


def _dtype(column: str) -> str:
    if column == "step":
        return "int64"
    if column == "time":
        return "datetime64[ns, UTC]"
    return "object" if column in TEXT_COLUMNS else "float64"


def _empty_frame(kind: str | None) -> pd.DataFrame:
    import pandas as pd  # only the frames need it: writers and record readers start faster without

    return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in _documented(kind)})


def load_metrics(run_dir: str, kind: str | None = None, missing_ok: bool = True) -> pd.DataFrame:
    """One row per record of `<run_dir>/metrics.jsonl`, sorted by time then step.

    Columns: kind, step (integer), time (UTC datetime), then the documented columns of `kind`
    ("train", "eval", "eval_source", "event"; all of them for None), then any other field the records carry.
    A step logged twice (a resumed run repeats the steps after its last checkpoint) keeps its
    latest train and eval record. A half-written last line (live run) is skipped. A run directory
    that does not exist yet (a job that has not started writing) or has no metrics gives an empty
    frame with the same columns; `missing_ok=False` makes a missing directory a UserError.
    """
    if not _check_run_dir(run_dir):
        if missing_ok:
            return _empty_frame(kind)
        raise UserError(f"run directory not found: {run_dir}")
    import pandas as pd

    records = _read_metrics(run_dir)
    if kind is not None:
        records = [r for r in records if r.get("kind") == kind]
    if not records:
        return _empty_frame(kind)
    df = pd.DataFrame.from_records(records)
    for c in _documented(kind):
        if c not in df.columns:
            df[c] = pd.Series(dtype=_dtype(c) if c not in ("step", "time") else "float64", index=df.index)
    df["time"] = pd.to_numeric(df["time"], errors="coerce")
    df["step"] = pd.to_numeric(df["step"], errors="coerce")
    df = df.sort_values(["time", "step"], kind="mergesort", na_position="last").reset_index(drop=True)
    df = _latest_per_step(df)
    df["step"] = df["step"].astype("int64" if df["step"].notna().all() else "Int64")
    df["time"] = pd.to_datetime(df["time"], unit="s", utc=True)
    front = _documented(kind)
    return df[front + [c for c in df.columns if c not in front]]


def _latest_per_step(df: pd.DataFrame) -> pd.DataFrame:
    """Drop train/eval records whose step a later record of the same kind logged again."""
    measured = df["kind"].isin(["train", "eval", "eval_source"]) & df["step"].notna()
    keys = ["kind", "step"] + (["source"] if "source" in df.columns else [])  # a source's own curve
    repeated = df[measured].duplicated(keys, keep="last")
    drop = repeated[repeated].index
    return df.drop(index=drop).reset_index(drop=True) if len(drop) else df
