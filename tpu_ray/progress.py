"""Live progress of a training run: steps done of total, samples and tokens per second, MFU where
the device's peak is known, and an ETA that counts the remaining phases and evaluations.

One computation (`Progress`, fed the run's records in order) serves three readers: the trainer's
own line (a rich bar on a terminal, a plain log line in `ray job logs`), `tpu-ray status RUN` /
`tpu-ray metrics RUN --follow` (the same records read back from the run directory), and the Ray
dashboard's gauges (tpu_ray/ray_gauges.py). Written by hand because no library knows a run's
phases and evaluation grid; rich only draws it.

The ETA is the measured time of what remains: the current span's steps at its latest measured
step time; a later phase's steps at the latest measured time per token times that phase's tokens
per step (an estimate, said so: attention makes longer sequences somewhat slower per token); each
remaining evaluation at the mean measured evaluation time (the time between the train record and
the evaluation record of one step, where both were written). Until an evaluation was timed, the
line says how many are left untimed instead of guessing.
"""

from __future__ import annotations

import datetime
import logging
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tpu_ray.errors import UserError
from tpu_ray.ray_gauges import RayGauges

if TYPE_CHECKING:
    from tpu_ray.config import TrainConfig

log = logging.getLogger("tpu_ray.train.loop")  # the trainer's lines keep the trainer's name


@dataclass(frozen=True)
class Plan:
    """What remains is counted against: total steps, the evaluation grid, each span's (end step,
    tokens per step)."""

    total: int
    eval_every: int | None
    spans: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, t: TrainConfig, seq_len: int) -> Plan:
        """From the train section and `seq_len` (shard.seq_len, the length of a run without phases)."""
        if t.phases:
            spans, end = [], 0
            for p in t.phases:
                end += p.steps
                spans.append((end, (p.batch_size or t.batch_size) * p.seq_len))
        else:
            spans = [(t.steps, t.batch_size * seq_len)]
        return cls(total=t.steps, eval_every=t.eval_every, spans=tuple(spans))

    def evaluations_after(self, step: int) -> int:
        """Evaluations still to come after `step`: each multiple of eval_every, and the last step."""
        if not self.eval_every or step >= self.total:
            return 0
        grid = set(range((step // self.eval_every + 1) * self.eval_every, self.total + 1, self.eval_every))
        return len(grid | {self.total})


@dataclass
class Progress:
    plan: Plan
    step: int = 0
    last_train: dict[str, Any] | None = None
    eval_seconds: list[float] = field(default_factory=list)
    evaluated: bool = False  # this run evaluates (an eval record was seen)
    evaluates: bool = True  # False: the training said it has nothing to evaluate (train_start's `evaluates`)
    ended: bool = False
    failed: str | None = None  # the training stage failed: its error
    last_time: float | None = None  # when the latest record was written

    def update(self, record: dict[str, Any]) -> None:
        """Take one record in; a damaged one (a step or time that is not a number) is left out."""
        kind = record.get("kind")
        when = record.get("time")
        if isinstance(when, (int, float)) and not isinstance(when, bool):
            self.last_time = max(self.last_time or 0.0, float(when))
        if kind == "train":
            step = record.get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                self.last_train, self.step = record, step
        elif kind == "eval":
            self.evaluated = True
            t = self.last_train
            if _number(record.get("eval_time_s")) is not None:  # the trainer timed it (any log_every)
                self.eval_seconds.append(float(record["eval_time_s"]))
            elif t is not None and t.get("step") == record.get("step") and record.get("time") and t.get("time"):
                self.eval_seconds.append(float(record["time"]) - float(t["time"]))
        elif kind == "event" and record.get("event") == "train_start":
            step = record.get("step")
            self.step = step if isinstance(step, int) and not isinstance(step, bool) else 0
            self.last_train, self.ended, self.failed = None, False, None
            self.evaluates = record.get("evaluates") is not False  # an older run's records: assumed to evaluate
        elif kind == "event" and record.get("event") == "stage_failed" and record.get("stage") == "train":
            self.failed = str(record.get("error") or "the training stage failed")
        elif kind == "event" and record.get("event") == "train_end":
            self.ended, self.step = True, int(record.get("steps") or self.step)

    def eta_s(self) -> float | None:
        """Seconds of steps and timed evaluations left; None before any step was timed."""
        r = self.last_train
        if r is None or not _number(r.get("step_time_s")) or not _number(r.get("tokens_per_s")):
            return None
        seconds, start = 0.0, 0
        for end, tokens in self.plan.spans:
            left = max(0, end - max(self.step, start))
            if start <= self.step < end:
                seconds += left * float(r["step_time_s"])
            elif self.step < start:
                seconds += left * tokens / float(r["tokens_per_s"])
            start = end
        if self.eval_seconds and self.evaluates:
            seconds += self.plan.evaluations_after(self.step) * sum(self.eval_seconds) / len(self.eval_seconds)
        return seconds

    def fields(self) -> dict[str, Any]:
        r = self.last_train or {}
        return {"step": self.step, "total": self.plan.total, "samples_per_s": _number(r.get("samples_per_s")),
                "tokens_per_s": _number(r.get("tokens_per_s")), "mfu": _number(r.get("mfu")), "loss": _number(r.get("loss")),
                "eta_s": 0.0 if self.ended else self.eta_s(),
                "evaluations_left": 0 if self.ended or not self.evaluates else self.plan.evaluations_after(self.step)}

    def line(self) -> str:
        f = self.fields()
        parts = [f"step {f['step']:,}/{f['total']:,} ({f['step'] / max(f['total'], 1):.0%})"]
        if f["samples_per_s"] is not None and f["tokens_per_s"] is not None:
            parts.append(f"{f['samples_per_s']:,.1f} samples/s, {f['tokens_per_s']:,.0f} tokens/s")
        if f["mfu"] is not None:
            parts.append(f"MFU {f['mfu']:.1%}")
        if self.ended:
            parts.append("finished")
        elif self.failed:
            parts.append(f"failed: {self.failed.splitlines()[0][:200]}")
        elif f["eta_s"] is not None:
            eta = f"ETA {_clock(f['eta_s'])}"
            left = f["evaluations_left"]
            if left and self.eval_seconds:
                eta += f" (with {left} evaluation{'s' * (left != 1)})"
            elif left:
                eta += f" + {left} evaluation{'s' * (left != 1)} not yet timed"
            if len(self.plan.spans) > 1:
                phase = next(i for i, (end, _) in enumerate(self.plan.spans) if self.step < end or
                             i == len(self.plan.spans) - 1)
                eta += f", phase {phase + 1} of {len(self.plan.spans)}"
            parts.append(eta)
        return " | ".join(parts)


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


class ProgressMirror:
    """A metrics-stream mirror (tpu_ray.metrics_stream.Mirror) printing the progress at each train
    record: a rich bar on a terminal, a plain `progress:` log line otherwise (`ray job logs`). It
    also sets Ray's gauges (tpu_ray/ray_gauges.py) when this process is connected to Ray."""

    kinds = ("train", "eval", "event")

    def __init__(self, plan: Plan, name: str, run_dir: str, terminal: bool | None = None):
        self.progress = Progress(plan)
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self.gauges = RayGauges.if_connected(name, run_dir)

    def write(self, record: dict[str, Any]) -> None:
        self.progress.update(record)
        if record.get("kind") != "train":
            return
        if self.gauges is not None:
            self.gauges.set(self.progress.fields())
        if self.terminal:
            _rich_line(self.progress)
        else:
            log.info("progress: %s", self.progress.line())

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _rich_line(p: Progress) -> None:
    from rich.console import Console
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_row(ProgressBar(total=p.plan.total, completed=p.step, width=30), p.line())
    Console(stderr=True).print(grid)


def status_line(run_dir: str) -> str:
    """The progress of the run in `run_dir` now, from its saved config and its metrics (the latest
    training's records: a resumed run's start is its last train_start)."""
    from tpu_ray.metrics_stream import read_records
    from tpu_ray.saved_config import read_saved_config

    cfg = read_saved_config(run_dir)
    if cfg is None:
        raise UserError(f"{run_dir}: no config.yaml here, so not a run directory; pass the run's --output-dir")
    records = sorted(read_records(run_dir), key=lambda r: _number(r.get("time")) or 0.0)  # a damaged time: first
    starts = [i for i, r in enumerate(records) if r.get("kind") == "event" and r.get("event") == "train_start"]
    if not starts:
        return "not training yet (no train_start in the metrics)"
    progress = Progress(Plan.of(cfg.train, cfg.shard.seq_len))
    for r in records[starts[-1]:]:
        progress.update(r)
    line = progress.line()
    if not progress.ended and not progress.failed and progress.last_time is not None:
        import time

        line += f" | last record {_clock(max(0.0, time.time() - progress.last_time))} ago"  # a stalled run shows it
    return line


def follow(run_dir: str, every_s: float = 2.0) -> int:
    """`tpu-ray metrics RUN --follow`: the progress line each time it changes, until train_end."""
    import time

    last = None
    while True:
        line = status_line(run_dir)
        if line != last:
            print(line, flush=True)
            last = line
        if line.endswith("finished"):
            return 0
        if " | failed: " in line:
            return 1
        time.sleep(every_s)


def _number(value: Any) -> float | None:
    """A figure from a record, or None where it is missing or damaged (text, null, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
