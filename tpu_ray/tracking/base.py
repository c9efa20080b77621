"""What every tracker shares: records become (step, {key: value}) metrics, sent from a thread of
the tracker's own, with one failure policy.

Why a thread: a tracking server is another machine on the network. The trainer's step loop must
never wait on it (a TPU slice idles while a POST times out), so `write` only queues; the thread
sends. Why the policy: a server that goes away must never stop training. A failed send is warned
about once and its records are kept and retried with the next ones (at most every RETRY_S); after
MAX_FAILURES failed attempts in a row, or a failure at the run's end, the tracker is dropped: warned,
recorded in the metrics stream as a `tracking` event (status retrying / dropped) and in
RUN/tracking.json. `metrics.jsonl` stays the run's source of truth either way.
"""

from __future__ import annotations

import logging
import math
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from tpu_ray import storage
from tpu_ray.redact import redact_obj
from tpu_ray.rundir import MODEL_DIR
from tpu_ray.tracking.state import update_state

log = logging.getLogger("tpu_ray.tracking")

MAX_FAILURES = 3
RETRY_S = 10.0
CLOSE_TIMEOUT_S = 300.0  # the longest the run's end waits for a tracker to send what it holds
REPORT_TIMEOUT_S = 240.0
MODEL_CARD = "README.md"  # RUN/model's model card, as train/export_safetensors.py names it
KINDS = ("train", "eval", "eval_source", "downstream", "event")
# Fields that are identity or bookkeeping, not figures.
_NOT_METRICS = {"kind", "time", "step", "seed", "learning_rate_index", "train_traces", "chance"}
_KEY_CHARS = re.compile(r"[^\w\-./ ]")


def metric_items(record: dict[str, Any]) -> dict[str, float]:
    """A record's numeric figures under tracker keys: `train/loss`, `eval/perplexity`,
    `eval/<source>/eval_loss`, `downstream/<task>/lr=<lr>/seed=<seed>/<split_metric>`."""
    kind = record.get("kind")
    if kind == "train":
        prefix = "train"
    elif kind == "eval":
        prefix = "eval"
    elif kind == "eval_source":
        prefix = f"eval/{record.get('source')}"
    elif kind == "downstream":
        if record.get("status") != "ok":
            return {}
        # the trial's whole identity: two models, settings or task versions fine-tuned into one run
        # directory at one step would otherwise write one series
        ident = "/".join(str(record.get(k) or "-")[:12] for k in ("task_hash", "settings_key", "model"))
        prefix = f"downstream/{record.get('task')}/{ident}/lr{float(record.get('learning_rate')):.8g}/seed{record.get('seed')}"
    else:
        return {}
    out = {}
    for k, v in record.items():
        if k in _NOT_METRICS or k == "learning_rate" and kind == "downstream":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        out[_KEY_CHARS.sub("_", f"{prefix}/{k}")] = float(v)
    return out


def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """A run's config (as dumped to JSON) as dotted parameters (`train.learning_rate`), each value as
    JSON gives it: W&B keeps numbers as numbers (its run table sorts and filters by them); MLflow
    takes text (`as_text`)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = value

    walk("", redact_obj(config))
    return out


def as_text(params: dict[str, Any]) -> dict[str, str]:
    """flat_config's values as MLflow's parameters: text, at most MLflow's 6,000 characters."""
    return {k: str(v)[:6000] for k, v in params.items()}


class Tracker:
    """A metrics-stream mirror (tpu_ray.metrics_stream.Mirror) sending to one tracker. Subclasses
    implement `_open` (start or continue the tracked run; returns its id), `_send(batch)` (a list of
    (step, {key: value})), `_artifacts(files, tmp_dirs)` and `_finish(ended)`. `run_name` names a new
    tracked run; `params` (flat_config) are the config it records."""

    name = "tracker"
    kinds = KINDS

    def __init__(self, run_dir: str, run_name: str, params: dict[str, Any], stage: str):
        self.run_dir, self.run_name, self.params, self.stage = run_dir, run_name, params, stage
        self._queue: queue.Queue = queue.Queue()
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._backlog: list[tuple[int, dict[str, float]]] = []
        self._failures = 0
        self._dropped = False
        self._opened = False
        self._ended = False
        self._downstream = False
        self._want_artifacts = False
        self.run_id: str | None = None
        self._unsent = 0  # records (and artifact requests) written but not yet sent: wait_idle
        self._sent = threading.Condition()
        self._thread = threading.Thread(target=self._serve, name=f"tpu-ray-{self.name}", daemon=True)
        self._thread.start()

    # --- the writer's side (the training thread): never blocks -----------------------------------
    def write(self, record: dict[str, Any]) -> None:
        if self._dropped:
            return
        kind = record.get("kind")
        if kind == "event":
            if record.get("event") == "train_end":
                self._count(+1)
                self._queue.put(("artifacts", None))
                self._ended = True
            return
        self._downstream |= kind == "downstream"
        items = metric_items(record)
        if items and record.get("step") is not None:
            self._count(+1)
            when = record.get("time")
            millis = int(when * 1000) if isinstance(when, (int, float)) and math.isfinite(when) else int(time.time() * 1000)
            self._queue.put(("metrics", (int(record["step"]), items, millis)))  # stamped when it happened

    def flush(self) -> None:
        pass

    def close(self) -> None:
        """Send what is held (and, after fine-tuning, the report), finish the tracked run's part;
        waits at most CLOSE_TIMEOUT_S."""
        if self.stage == "finetune" and self._downstream:
            self._queue.put(("artifacts", None))
        self._queue.put(("close", None))
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            self._drop(f"still sending after {CLOSE_TIMEOUT_S:.0f} s at the run's end")

    def wait_idle(self, timeout: float) -> bool:
        """True once everything written so far was sent (or the tracker was dropped)."""
        with self._sent:
            return self._sent.wait_for(lambda: self._unsent <= 0 or self._dropped, timeout)

    def _count(self, n: int) -> None:
        with self._sent:
            self._unsent += n
            self._sent.notify_all()

    def take_events(self) -> list[dict[str, Any]]:
        with self._lock:
            events, self._events = self._events, []
        return events

    # --- the tracker's thread ---------------------------------------------------------------------
    def _serve(self) -> None:
        last_try = time.monotonic()
        self._attempt(final=False)  # the tracked run opened (or continued) at once, before any record
        while True:
            try:
                what, item = self._queue.get(timeout=RETRY_S)
            except queue.Empty:
                what, item = "retry", None
            if what == "metrics":
                self._backlog.append(item)
            self._want_artifacts |= what == "artifacts"
            final = what == "close"
            if not self._dropped and (self._backlog or self._want_artifacts or final or not self._opened):
                if final or self._failures == 0 or time.monotonic() - last_try >= RETRY_S:
                    last_try = time.monotonic()
                    self._attempt(final)
            if final:
                return

    def _attempt(self, final: bool) -> None:
        try:
            if not self._opened:
                self.run_id = self._open()
                self._opened = True
                update_state(self.run_dir, self.name, run_id=self.run_id, status="sending")
            if self._backlog:
                held = len(self._backlog)
                try:
                    self._send(self._backlog)  # a client may take what it sent off the list as it goes
                finally:
                    self._count(-(held - len(self._backlog)))  # sent before a failure: never sent again
                self._count(-len(self._backlog))
                self._backlog = []
            if self._want_artifacts:
                self._send_artifacts()
                self._want_artifacts = False
                self._count(-1)
            if final:
                self._finish(self._ended)
                update_state(self.run_dir, self.name, run_id=self.run_id, status="sent")  # everything went
            if self._failures:
                log.warning("%s: reachable again; the held records were sent", self.name)
                self._event("resumed")
            self._failures = 0
        except Exception as exc:  # noqa: BLE001 - a tracker's failure is never the run's
            self._failures += 1
            if final or self._failures >= MAX_FAILURES:
                self._drop(f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
            elif self._failures == 1:
                log.warning("%s: sending failed (%s); training goes on, the records are kept and retried",
                            self.name, str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
                self._event("retrying", error=str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)

    def _drop(self, why: str) -> None:
        if self._dropped:
            return
        self._dropped = True
        lost = sum(len(items) for _, items, _ in self._backlog)
        self._backlog = []
        log.warning("%s: dropped after %d failed attempts (%s); the run goes on, %d held values are not "
                    "sent, metrics.jsonl keeps every record", self.name, self._failures, why, lost)
        self._event("dropped", error=why, unsent_values=lost)
        self._count(0)  # wakes wait_idle: nothing more will be sent
        try:
            update_state(self.run_dir, self.name, run_id=self.run_id, status="dropped", error=why)
        except OSError:
            pass

    def _event(self, status: str, **fields: Any) -> None:
        with self._lock:
            self._events.append({"event": "tracking", "stage": self.stage, "tracker": self.name,
                                 "status": status, "run_id": self.run_id, **fields})

    def _send_artifacts(self) -> None:
        """The model card (RUN/model/README.md) and the report with its plots, rendered now by
        `tpu-ray report` in a process of its own: the report reads the whole run (a layer above the
        trainer, which this runs in) and its plotting memory never stays in the trainer."""
        with tempfile.TemporaryDirectory(prefix="tpu-ray-tracking-") as tmp:
            files = {}
            card = storage.join(self.run_dir, MODEL_DIR, MODEL_CARD)
            if storage.exists(card):
                local = f"{tmp}/{MODEL_CARD}"
                with open(local, "wb") as f:
                    f.write(storage.read_bytes(card))
                files["model"] = local
            report = f"{tmp}/report"
            done = subprocess.run([sys.executable, "-m", "tpu_ray.cli", "report", self.run_dir, "--out", report],
                                  capture_output=True, text=True, timeout=REPORT_TIMEOUT_S)
            if done.returncode:
                raise RuntimeError(f"tpu-ray report failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
            self._artifacts(files, {"report": report})

    # --- what each tracker implements --------------------------------------------------------------
    def _open(self) -> str:
        raise NotImplementedError

    def _send(self, batch: list[tuple[int, dict[str, float]]]) -> None:
        raise NotImplementedError

    def _artifacts(self, files: dict[str, str], dirs: dict[str, str]) -> None:
        raise NotImplementedError

    def _finish(self, ended: bool) -> None:
        raise NotImplementedError
