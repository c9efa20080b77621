"""The trainer's own hooks, each an object holding its own state: the log (sums every execution, a
record on its grid), the evaluation, the checkpoint (by steps and by time), the downstream snapshot;
see hooks.py for the timing. Split from loop.py so the loop reads as its steps."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_ray.config import ModelConfig, TrainConfig
from tpu_ray.errors import UserError
from tpu_ray.train.hooks import Hook, Hooks, StepInfo, TrainSums
from tpu_ray.train.metrics import MetricsWriter, eval_line, train_line
from tpu_ray.train.model import peak_flops, train_flops_per_token

log = logging.getLogger("tpu_ray.train.loop")  # the trainer's log lines keep the trainer's name


class Interval:
    """Sums over one logging interval."""

    def __init__(self) -> None:
        self.loss = self.correct = self.count = self.unscored = 0.0
        self.steps = 0
        self.seconds = 0.0
        self.input_wait = 0.0

    def add(self, sums: TrainSums, n: int, seconds: float, input_wait: float = 0.0) -> None:
        self.loss += float(sums.loss)
        self.correct += float(sums.correct)
        self.count += float(sums.count)
        self.unscored += float(sums.unscored)  # masked pieces beyond the bound
        self.steps += n
        self.seconds += seconds
        self.input_wait += input_wait  # NaN once any execution ran several steps

    def record(self, s: Any, gb: int, seq_len: int, flops_token: float, peak: float | None,
               replicas: int) -> dict[str, Any]:
        step_time = self.seconds / max(self.steps, 1)
        tokens_s = gb * seq_len / step_time if step_time else 0.0
        # No masked token counted (or a non-finite sum): the interval has no loss, never a 0.0.
        return {
            "loss": self.loss / self.count if self.count else math.nan,
            "accuracy": self.correct / self.count if self.count else math.nan,
            "learning_rate": float(s.schedule(s.optimizer.iterations - 1)),
            "step_time_s": step_time,
            "samples_per_s": gb / step_time if step_time else 0.0,
            "tokens_per_s": tokens_s,
            "mfu": tokens_s * flops_token / (peak * replicas) if peak else None,
            "input_wait_s": self.input_wait / max(self.steps, 1),
            "unscored_targets": int(self.unscored),
        }


class TrainLog(Hook):
    """Sums every execution (see); writes a train record on its grid (run) over the span running now
    (its seq_len, batch and FLOPs per token); holds the run's last record, its last finite one
    (summary.json's final_loss and its step) and the first step whose loss was not finite
    (train.on_nan=continue goes on past it)."""

    name = "log"

    def __init__(self, s: Any, metrics: MetricsWriter, nonfinite: NonFinite, flops_of: Callable[[Any], float],
                 peak: float | None, traces: Callable[[], int],
                 source_samples: Callable[[int], dict[str, int]] | None = None) -> None:
        self.s, self.metrics, self.nonfinite, self.flops_of, self.peak = s, metrics, nonfinite, flops_of, peak
        self.traces, self.source_samples = traces, source_samples
        self.level = logging.INFO if s.info.is_chief else logging.DEBUG
        self.interval = Interval()
        self.span: Any = None  # the plan's span running now (train/phases.Span): set by `start_span`
        self.last: dict[str, Any] | None = None
        self.last_finite: dict[str, Any] | None = None
        self.diverged_at: int | None = None
        self.warned_unscored = False

    def start_span(self, span: Any) -> None:
        """The records from here on are span `span`'s (none mixes two phases' figures: the loop
        forces a record at each span's end)."""
        self.span = span

    def see(self, info: StepInfo) -> None:
        self.interval.add(info.sums, info.steps, info.seconds, info.input_wait)
        if not math.isfinite(float(info.sums.loss)):  # log what was seen, then stop (or go on)
            if self.diverged_at is None:
                self.diverged_at = info.step
            self.run(info.step)
            self.nonfinite(info.step, f"the loss is {float(info.sums.loss) / max(float(info.sums.count), 1.0)}")

    def run(self, step: int, last: bool = False) -> None:
        if not self.interval.steps:  # already logged at this step (a non-finite one): no empty record
            return
        span = self.span
        record = self.interval.record(self.s, span.batch_size, span.seq_len, self.flops_of(span), self.peak,
                                      self.s.info.replicas)
        record["seq_len"] = span.seq_len
        finite = math.isfinite(record["loss"])
        if not finite:  # the JSON stores NaN as null: say why it is missing
            record["nonfinite"] = True
        if self.source_samples is not None:  # a mixture: samples drawn from each source so far
            record.update({f"samples/{name}": n for name, n in self.source_samples(step).items()})
        self.last = self.metrics.write("train", step=step, **record, train_traces=self.traces())
        if record["unscored_targets"] and not self.warned_unscored:
            self.warned_unscored = True
            log.warning("step %d: %d masked pieces were beyond the predictions bound per sequence and not "
                        "scored (the train records' unscored_targets count them): words longer than the "
                        "shards' sample showed", step, record["unscored_targets"])
        if finite:
            self.last_finite = self.last
        log.log(self.level, train_line(self.last))
        self.interval = Interval()

    def recover(self, records: list[dict[str, Any]], step: int) -> None:
        """The run's own last train records up to `step` (see recover_results)."""
        for r in records:
            at = r.get("step")
            if r.get("kind") != "train" or not isinstance(at, int) or at > step:
                continue
            self.last = r
            if isinstance(r.get("loss"), (int, float)):
                self.last_finite = r
                if self.diverged_at is not None and at >= self.diverged_at:  # a retry that did not
                    self.diverged_at = None
            elif r.get("nonfinite") and self.diverged_at is None:
                self.diverged_at = at


class Evaluate(Hook):
    """The periodic evaluation (train/evaluation.py): each source's record, then the pooled one;
    holds the last pooled record (summary.json's eval figures, the model card's)."""

    name = "eval"

    def __init__(self, evaluate: Callable[[int], Any], metrics: MetricsWriter, level: int) -> None:
        self.evaluate, self.metrics, self.level = evaluate, metrics, level
        self.last: dict[str, Any] | None = None

    def run(self, step: int, last: bool = False) -> None:
        began = time.monotonic()  # the progress line's ETA counts evaluations at this duration
        evaluation = self.evaluate(step)
        self.last, per_source = evaluation.record(self.metrics, eval_time_s=round(time.monotonic() - began, 3))
        for record in per_source if len(per_source) > 1 else []:  # one source: its line repeats the pooled one
            log.log(self.level, eval_line(record))
        log.log(self.level, eval_line(self.last))

    def recover(self, records: list[dict[str, Any]], step: int) -> None:
        """The run's own last eval record up to `step` (see recover_results)."""
        for r in records:
            at = r.get("step")
            if r.get("kind") == "eval" and isinstance(at, int) and at <= step:
                self.last = r


class Checkpoint(Hook):
    """A checkpoint with the input position beside it; never one of a diverged model (it would
    replace the last good one). `timer`: train.checkpoint_every_minutes, restarted by every save."""

    name = "checkpoint"

    def __init__(self, model: Any, ckpts: Any, nonfinite: NonFinite, position: Callable[[int], str] | None = None,
                 timer: Any = None) -> None:
        self.model, self.ckpts, self.nonfinite, self.position, self.timer = model, ckpts, nonfinite, position, timer

    def run(self, step: int, last: bool = False) -> None:
        if weights_finite(self.model):
            self.ckpts.save(step, position=self.position(step) if self.position else None, final=last)
        else:
            self.nonfinite(step, "the weights are not finite (not saved)")
        if self.timer is not None:
            self.timer.reset()


class TimedCheckpoint(Hook):
    """The checkpoint by time too: off the step grid, asked after every execution."""

    name = "checkpoint_timer"

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint

    def run(self, step: int, last: bool = False) -> None:
        if self.checkpoint.timer.due():
            self.checkpoint.run(step, last)


class Snapshot(Hook):
    """eval.downstream: the model at each task's grid goes where the driver fine-tunes it beside the
    training (tpu_ray.downstream.during); a step two tasks share is written once. `write(step)`
    exports the model; only the chief writes."""

    name = "downstream_snapshot"

    def __init__(self, write: Callable[[int], None], chief: bool) -> None:
        self.write, self.chief = write, chief
        self.written: set[int] = set()

    def run(self, step: int, last: bool = False) -> None:
        if self.chief and step not in self.written:
            self.written.add(step)
            self.write(step)


@dataclass(frozen=True)
class HookSpec:
    """What the trainer's hooks read of the train section, resolved once by the trainer (`of`): each
    one's grid, what a non-finite loss does, and the peak FLOPs an MFU is taken against."""

    log_every: int  # train.log_every
    eval_every: int  # train.eval_every
    checkpoint_every: int  # train.checkpoint_every
    on_nan: str  # train.on_nan: stop | continue
    peak_flops: float | None  # train.peak_flops (None: the device's published figure, if any)

    @classmethod
    def of(cls, t: TrainConfig) -> HookSpec:
        return cls(t.log_every, t.eval_every, t.checkpoint_every, t.on_nan, t.peak_flops)


def trainer_hooks(spec: HookSpec, s: Any, ckpts: Any, metrics: MetricsWriter, evaluate: Callable[[int], Any] | None,
                  traces: Callable[[], int], flops_of: Callable[[Any], float],
                  position: Callable[[int], str] | None = None, timer: Any = None,
                  source_samples: Callable[[int], dict[str, int]] | None = None) -> Hooks:
    """log (sums every execution, a record each log_every) -> eval (eval_every) -> checkpoint
    (checkpoint_every, and when `timer` is due: train.checkpoint_every_minutes); each also at the
    run's last step. `position(step)` is the input position saved beside each checkpoint."""
    nonfinite = NonFinite(spec.on_nan, metrics, ckpts)
    hooks = Hooks()
    train_log = hooks.add(TrainLog(s, metrics, nonfinite, flops_of, peak_flops(s.info.device, spec.peak_flops),
                                   traces, source_samples), every=spec.log_every)
    if evaluate:
        hooks.add(Evaluate(evaluate, metrics, train_log.level), every=spec.eval_every)
    checkpoint = hooks.add(Checkpoint(s.model, ckpts, nonfinite, position, timer), every=spec.checkpoint_every)
    if timer is not None:
        hooks.add(TimedCheckpoint(checkpoint), every=None)
    return hooks


class PhaseFlops:
    """Training FLOPs per token of each span, kept by the span's index (an object's `id()` is no key:
    a later phase's object may take a freed one's id, and with it that phase's FLOPs). What
    train/model.train_flops_per_token reads: the model and train sections, the run's shard length,
    the vocabulary and the built model's transformers config."""

    def __init__(self, model: ModelConfig, t: TrainConfig, seq_len: int, vocab_size: int, model_config: Any):
        self.model, self.t, self.seq_len = model, t, seq_len
        self.vocab_size, self.model_config = vocab_size, model_config
        self.by_phase: dict[int, float] = {}

    def of(self, span: Any) -> float:
        """Span `span`'s FLOPs per token (train/phases.Span: its length and masking rate)."""
        if span.index not in self.by_phase:
            self.by_phase[span.index] = train_flops_per_token(self.model, self.t, self.seq_len, self.vocab_size,
                                                                 self.model_config, span)
        return self.by_phase[span.index]


def weights_finite(model: Any) -> bool:
    """True if no weight is NaN or infinite (checked before every checkpoint save)."""
    import tensorflow as tf

    return all(bool(tf.reduce_all(tf.math.is_finite(w)).numpy()) for w in model.trainable_weights
               if w.dtype.is_floating)


class NonFinite:
    """A diverged run: stop with one line naming the step and the checkpoint that is kept (the
    default, train.on_nan=stop), or warn and go on (train.on_nan=continue)."""

    def __init__(self, on_nan: str, metrics: MetricsWriter, ckpts: Any) -> None:
        self.on_nan, self.metrics, self.ckpts = on_nan, metrics, ckpts

    def __call__(self, step: int, what: str) -> None:
        kept = self.ckpts.latest_saved or "none yet"
        self.metrics.event("nonfinite", stage="train", step=step, what=what, checkpoint=kept)
        if self.on_nan == "continue":
            log.warning("step %d: %s; continuing (train.on_nan=continue), last good checkpoint: %s", step, what, kept)
            return
        raise UserError(f"step {step}: {what}, training stopped; the last good checkpoint is kept ({kept}); "
                        f"lower train.learning_rate and rerun with --resume, or set train.on_nan=continue")


def recover_results(run_dir: str, step: int, train_log: TrainLog, evaluation: Evaluate | None) -> None:
    """The run's own last train and eval records up to `step`, from its metrics stream: a run resumed
    at its last step (or retried after a failure past its last checkpoint) runs no step, and must not
    replace the results it has with none (history is append-only)."""
    from tpu_ray.metrics_stream import read_records

    records = sorted(read_records(run_dir), key=lambda r: (r.get("time") or 0.0))
    train_log.recover(records, step)
    if evaluation is not None:
        evaluation.recover(records, step)
