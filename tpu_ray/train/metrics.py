"""The metrics stream: JSON lines in `<run_dir>/metrics.jsonl`, plus a readable log line.

Ray jobs return nothing to the submitter, so the run directory is the channel: the Python API and
`tpu-ray report` read this file, live or after the fact (see report.load_metrics).
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from tpu_ray import storage
from tpu_ray.redact import redact
from tpu_ray.rundir import METRICS_DIR, METRICS_FILE

log = logging.getLogger("tpu_ray.train.metrics")
SEGMENT_BYTES = 1 << 20


def writer_id() -> str:
    """Unique per writer and sortable by start time: `<ms since epoch>-<host>-<pid>-<random>`."""
    import os
    import socket
    import uuid

    host = "".join(c if c.isalnum() or c in "-." else "_" for c in socket.gethostname())[:40]
    return f"{int(time.time() * 1000):013d}-{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class MetricsWriter:
    """Appends records. Local files are appended and flushed per record. Object stores cannot
    append, and a read-modify-write of one shared object loses records when two writers overlap
    (the pipeline's and the trainer's, or a trainer restarted after a lost node beside the old
    one's last upload). So on gs:// every writer owns its objects, `metrics/<writer id>-<n>.jsonl`,
    and rewrites only its own current object (rolled over at SEGMENT_BYTES, so each upload stays
    small); nobody reads before writing. `report.load_metrics` merges `metrics.jsonl` and all of
    these by time. New records are uploaded at most every `remote_every_s` (at once for evaluations
    and events), so a crash loses at most the records of the current interval. An upload that
    fails during training is retried at the next one instead of ending a long run; `flush()`
    itself raises.
    """

    def __init__(self, run_dir: str, remote_every_s: float = 30.0, tensorboard: bool = True):
        self.run_dir = run_dir
        self.tensorboard = tensorboard  # train/eval records also go to <run_dir>/tensorboard
        self._tb = None
        self.path = storage.join(run_dir, METRICS_FILE)
        self.remote = storage.is_remote(self.path)
        self._pending: list[str] = []
        self._every = remote_every_s
        self._last_upload = 0.0
        self._writer_id = writer_id()
        self._segment = 0
        self._segment_lines: list[str] = []  # this writer's records in its current object
        self._segment_bytes = 0

    def write(self, kind: str, **fields: Any) -> dict:
        record = {"kind": kind, "time": time.time(), **{k: _clean(v) for k, v in fields.items()}}
        if kind in ("train", "eval", "eval_source") and self.tensorboard:
            self._tensorboard().write(record)
        line = redact(json.dumps(record)) + "\n"  # an error naming a URL keeps no password
        if self.remote:
            self._pending.append(line)
            if time.monotonic() - self._last_upload >= self._every or kind != "train":
                try:
                    self.flush()
                except storage.StorageError as exc:
                    log.warning("metrics upload failed, retried with the next records: %s", exc)
                    self._last_upload = time.monotonic()
        else:
            storage.append_text_local(self.path, line)  # never through a link planted in its place
        return record

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
        """Flush, and release the TensorBoard writer (its thread and staging directory)."""
        self.flush()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def _tensorboard(self):
        if self._tb is None:  # imported on first use: reading metrics needs no TensorFlow
            from tpu_ray.train.tensorboard import TensorBoardWriter

            self._tb = TensorBoardWriter(self.run_dir)
        return self._tb

    def event(self, event: str, **fields: Any) -> dict:
        return self.write("event", event=event, **fields)


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _num(v: Any, spec: str) -> str:
    """`v` formatted with `spec`; NaN/inf (stored as None in the JSON record) print as nan."""
    return "nan" if v is None else format(v, spec)


def train_line(r: dict) -> str:
    mfu = f" mfu={r['mfu']:.1%}" if r.get("mfu") is not None else ""
    wait = f" input_wait={r['input_wait_s'] * 1e3:.1f}ms" if r.get("input_wait_s") is not None else ""
    return (f"step {r['step']}: loss={_num(r['loss'], '.4f')} acc={_num(r['accuracy'], '.3f')} "
            f"lr={_num(r['learning_rate'], '.2e')} step_time={r['step_time_s'] * 1e3:.1f}ms "
            f"{r['samples_per_s']:.1f} samples/s {r['tokens_per_s']:,.0f} tokens/s{mfu}{wait} traces={r['train_traces']}")


def eval_line(r: dict) -> str:
    where = f" [{r['source']}]" if r.get("kind") == "eval_source" else ""
    bpb = f" bits/byte={_num(r['bits_per_byte'], '.3f')}" if r.get("bits_per_byte") is not None else ""
    return (f"eval{where} @ step {r['step']}: loss={_num(r['eval_loss'], '.4f')} acc={_num(r['eval_accuracy'], '.3f')} "
            f"perplexity={_num(r['perplexity'], '.2f')}{bpb}")
