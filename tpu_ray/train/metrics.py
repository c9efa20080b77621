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
from tpu_ray.rundir import METRICS_FILE

log = logging.getLogger("tpu_ray.train.metrics")


class MetricsWriter:
    """Appends records. Local files are appended and flushed per record. Object stores cannot
    append, so for gs:// new records are held and uploaded at most every `remote_every_s` (and at
    once for evaluations and events) by rewriting the file as what is there plus what is new:
    several writers that take turns on one run (the pipeline's, then the trainer's, then the
    pipeline's again) all keep their records. An upload that fails during training is retried at
    the next one instead of ending a long run; `flush()` itself raises.
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

    def write(self, kind: str, **fields: Any) -> dict:
        record = {"kind": kind, "time": time.time(), **{k: _clean(v) for k, v in fields.items()}}
        if kind in ("train", "eval") and self.tensorboard:
            self._tensorboard().write(record)
        line = json.dumps(record) + "\n"
        if self.remote:
            self._pending.append(line)
            if time.monotonic() - self._last_upload >= self._every or kind != "train":
                try:
                    self.flush()
                except storage.StorageError as exc:
                    log.warning("metrics upload failed, retried with the next records: %s", exc)
                    self._last_upload = time.monotonic()
        else:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
        return record

    def flush(self) -> None:
        """Upload held records (gs://) and TensorBoard events."""
        if self.remote and self._pending:
            existing = storage.read_text(self.path) if storage.exists(self.path) else ""
            storage.atomic_write_text(self.path, existing + "".join(self._pending))
            self._pending.clear()
            self._last_upload = time.monotonic()
        if self._tb is not None:
            self._tb.flush()

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
    return (f"eval @ step {r['step']}: loss={_num(r['eval_loss'], '.4f')} acc={_num(r['eval_accuracy'], '.3f')} "
            f"perplexity={_num(r['perplexity'], '.2f')}")
