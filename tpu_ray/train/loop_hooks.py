"""The trainer's own hooks: accumulate every execution, then log, evaluate and checkpoint each on its
own `every=` grid (see hooks.py for the timing). Split from loop.py so the loop reads as its steps."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError
from tpu_ray.train.hooks import Hooks, StepInfo
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

    def add(self, sums, n: int, seconds: float, input_wait: float = 0.0) -> None:
        self.loss += float(sums[0])
        self.correct += float(sums[1])
        self.count += float(sums[2])
        self.unscored += float(sums[3]) if len(sums) > 3 else 0.0  # masked pieces beyond the bound
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


@dataclass
class LoopState:
    interval: Interval | None = None
    last: dict[str, Any] | None = None
    last_eval: dict[str, Any] | None = None
    # The last train record with a finite loss (summary.json's final_loss and its step), and the
    # first step whose loss was not finite (train.on_nan=continue goes on past it).
    last_finite: dict[str, Any] | None = None
    diverged_at: int | None = None
    warned_unscored: bool = False
    # The span of the plan running now (train/plan.py: its seq_len, batch, masking); None: the run's own.
    span: Any = None


def default_hooks(cfg: RunConfig, s: Any, ckpts: Any, metrics: MetricsWriter,
                  state: LoopState, evaluate: Callable[[int], Any] | None, traces: Callable[[], int],
                  position: Callable[[int], str] | None = None,
                  timer: Any = None, source_samples: Callable[[int], dict[str, int]] | None = None) -> Hooks:
    """accumulate (every execution) -> log (log_every) -> eval (eval_every) -> checkpoint
    (checkpoint_every, and when `timer` is due: train.checkpoint_every_minutes); each also at the
    run's last step. `position(step)` is the input position saved beside each checkpoint."""
    t, info = cfg.train, s.info
    level = logging.INFO if info.is_chief else logging.DEBUG
    flops_token = train_flops_per_token(cfg, s.tok.vocab_size, s.model.config)
    phase_flops = PhaseFlops(cfg, s.tok.vocab_size, s.model.config)
    peak = peak_flops(info.device, t.peak_flops)
    state.interval = Interval()

    def accumulate(step: StepInfo) -> None:
        state.interval.add(step.sums, step.steps, step.seconds, step.input_wait)
        if not math.isfinite(float(step.sums[0])):  # log what was seen, then stop (or go on)
            if state.diverged_at is None:
                state.diverged_at = step.step
            log_train(step)
            on_nonfinite(cfg, metrics, ckpts, step.step,
                         f"the loss is {float(step.sums[0]) / max(float(step.sums[2]), 1.0)}")

    def log_train(step: StepInfo) -> None:
        if not state.interval.steps:  # already logged at this step (a non-finite one): no empty record
            return
        span = state.span  # the span's own seq_len, batch and FLOPs per token (train.phases)
        gb, seq_len = (t.batch_size, cfg.shard.seq_len) if span is None else (span.batch_size, span.seq_len)
        flops = flops_token if span is None else phase_flops.of(span)
        record = state.interval.record(s, gb, seq_len, flops, peak, info.replicas)
        record["seq_len"] = seq_len
        finite = math.isfinite(record["loss"])
        if not finite:  # the JSON stores NaN as null: say why it is missing
            record["nonfinite"] = True
        if source_samples is not None:  # a mixture: samples drawn from each source so far
            record.update({f"samples/{name}": n for name, n in source_samples(step.step).items()})
        state.last = metrics.write("train", step=step.step, **record, train_traces=traces())
        if record["unscored_targets"] and not state.warned_unscored:
            state.warned_unscored = True
            log.warning("step %d: %d masked pieces were beyond the predictions bound per sequence and not "
                        "scored (the train records' unscored_targets count them): words longer than the "
                        "shards' sample showed", step.step, record["unscored_targets"])
        if finite:
            state.last_finite = state.last
        log.log(level, train_line(state.last))
        state.interval = Interval()

    def run_eval(step: StepInfo) -> None:
        state.last_eval, per_source = evaluate(step.step).record(metrics)  # train/evaluation.py
        for record in per_source if len(per_source) > 1 else []:  # one source: its line repeats the pooled one
            log.log(level, eval_line(record))
        log.log(level, eval_line(state.last_eval))

    hooks = Hooks()
    hooks.add("accumulate", None, accumulate)
    hooks.add("log", t.log_every, log_train)
    if evaluate:
        hooks.add("eval", t.eval_every, run_eval)

    def save(step: StepInfo) -> None:
        if weights_finite(s.model):
            ckpts.save(step.step, position=position(step.step) if position else None, final=step.last)
        else:  # never let a diverged model replace the last good checkpoint
            on_nonfinite(cfg, metrics, ckpts, step.step, "the weights are not finite (not saved)")
        if timer is not None:
            timer.reset()

    hooks.add("checkpoint", t.checkpoint_every, save)
    if timer is not None:  # by time too: off the step grid, checked after every execution
        hooks.add("checkpoint_timer", None, lambda step: save(step) if timer.due() else None)
    return hooks


class PhaseFlops:
    """Training FLOPs per token of each span, kept by the span's index (an object's `id()` is no key:
    a later phase's object may take a freed one's id, and with it that phase's FLOPs)."""

    def __init__(self, cfg: RunConfig, vocab_size: int, model_config: Any):
        self.cfg, self.vocab_size, self.model_config = cfg, vocab_size, model_config
        self.by_phase: dict[int, float] = {}

    def of(self, span: Any) -> float:
        """Span `span`'s FLOPs per token (train/phases.Span: its length and masking rate)."""
        if span.index not in self.by_phase:
            self.by_phase[span.index] = train_flops_per_token(self.cfg, self.vocab_size, self.model_config, span)
        return self.by_phase[span.index]


def weights_finite(model: Any) -> bool:
    """True if no weight is NaN or infinite (checked before every checkpoint save)."""
    import tensorflow as tf

    return all(bool(tf.reduce_all(tf.math.is_finite(w)).numpy()) for w in model.trainable_weights
               if w.dtype.is_floating)


def on_nonfinite(cfg: RunConfig, metrics: MetricsWriter, ckpts: Any, step: int, what: str) -> None:
    """A diverged run: stop with one line naming the step and the checkpoint that is kept (the
    default, train.on_nan=stop), or warn and go on (train.on_nan=continue)."""
    kept = ckpts.latest_saved or "none yet"
    metrics.event("nonfinite", stage="train", step=step, what=what, checkpoint=kept)
    if cfg.train.on_nan == "continue":
        log.warning("step %d: %s; continuing (train.on_nan=continue), last good checkpoint: %s", step, what, kept)
        return
    raise UserError(f"step {step}: {what}, training stopped; the last good checkpoint is kept ({kept}); "
                    f"lower train.learning_rate and rerun with --resume, or set train.on_nan=continue")


def recover_results(run_dir: str, step: int, state: LoopState) -> None:
    """The run's own last train and eval records up to `step`, from its metrics stream: a run resumed
    at its last step (or retried after a failure past its last checkpoint) runs no step, and must not
    replace the results it has with none (history is append-only)."""
    from tpu_ray.metrics_stream import read_records

    records = sorted(read_records(run_dir), key=lambda r: (r.get("time") or 0.0))
    for r in records:
        at = r.get("step")
        if not isinstance(at, int) or at > step:
            continue
        if r.get("kind") == "train":
            state.last = r
            if isinstance(r.get("loss"), (int, float)):
                state.last_finite = r
                if state.diverged_at is not None and at >= state.diverged_at:  # a retry that did not
                    state.diverged_at = None
            elif r.get("nonfinite") and state.diverged_at is None:
                state.diverged_at = at
        elif r.get("kind") == "eval":
            state.last_eval = r
