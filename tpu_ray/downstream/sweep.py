"""The seeds x learning-rates grid as parallel Ray tasks, its summary, and its records.

Why Ray tasks and not Ray Tune: the grid is fixed (no search algorithm, no early stopping), and
Tune would add an experiment directory, trial actors and its own progress output to what is here a
map over trials; a task per trial with `num_cpus`/`num_gpus` gives the same parallelism and placement.
A trial that raises is reported as failed with its reason and left out of the mean, never averaged in.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from typing import Any

from tpu_ray.downstream.finetune import FinetuneSpec
from tpu_ray.downstream.tasks import Task
from tpu_ray.logs import is_verbose, quiet_libraries
from tpu_ray.downstream.finetune import finetune_trial
from tpu_ray.errors import failure_line

log = logging.getLogger("tpu_ray.downstream")
SEED_BASE = 0  # seeds are 0..N-1: the same N gives the same trials in every run


@dataclass
class Trial:
    seed: int
    learning_rate: float
    status: str = "ok"  # "ok" or "failed"
    error: str | None = None
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def metrics(self) -> dict[str, float]:
        return self.result.get("metrics", {})


@dataclass
class Summary:
    """The sweep's outcome: every trial, the best learning rate by the task's first metric, and the
    mean and standard deviation over that learning rate's seeds."""

    task: str
    task_hash: str
    step: int | None
    trials: list[Trial]
    metric: str
    chance: float | None

    def by_lr(self) -> dict[float, list[Trial]]:
        out: dict[float, list[Trial]] = {}
        for t in self.trials:
            out.setdefault(t.learning_rate, []).append(t)
        return out

    def stats(self, lr: float) -> tuple[float, float, int]:
        """(mean, sample sd, n) of the metric over lr's finished seeds; sd 0 for one seed."""
        values = [t.metrics[self.metric] for t in self.by_lr()[lr] if t.status == "ok"]
        if not values:
            return float("nan"), float("nan"), 0
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values)

    @property
    def best_lr(self) -> float | None:
        done = [lr for lr in self.by_lr() if self.stats(lr)[2]]
        return max(done, key=lambda lr: self.stats(lr)[0]) if done else None

    def lines(self) -> list[str]:
        out = []
        for lr, trials in self.by_lr().items():
            mean, sd, n = self.stats(lr)
            mark = "  <- best" if lr == self.best_lr else ""
            out.append(f"  lr {lr:g}: {self.metric} {mean:.4f} ± {sd:.4f} over {n} of {len(trials)} seeds{mark}")
            out += [f"    seed {t.seed} failed: {t.error}" for t in trials if t.status != "ok"]
        best = self.best_lr
        if best is None:
            out.append(f"{self.task}: every trial failed")
        else:
            mean, sd, n = self.stats(best)
            chance = f" (chance {self.chance:.4f})" if self.chance is not None else ""
            out.append(f"{self.task} {self.metric}: {mean:.4f} ± {sd:.4f} over {n} seeds at lr {best:g}{chance}")
        return out


def _finetune_task(model_dir: str, task: Task, seed: int, lr: float, spec: FinetuneSpec) -> dict[str, Any]:
    """One trial, in a Ray worker."""
    import os

    quiet_libraries(is_verbose())  # TensorFlow's start-up lines in each worker, as in the driver

    save_to = os.path.join(spec.export_dir, f"lr{lr:g}-seed{seed}") if spec.export_dir else None
    return finetune_trial(model_dir, task, seed, lr, spec, save_to=save_to)


def submit_trials(model_dir: str, task: Task, spec: FinetuneSpec,
                  options: dict[str, Any] | None = None) -> dict[Any, Trial]:
    """Every (seed, lr) pair as a Ray task on the connected cluster, started now: {ref: its Trial}.
    `options`: more Ray task options (eval.downstream keeps the trials off TPU hosts)."""
    import ray

    trial = ray.remote(num_cpus=spec.cpus_per_trial, num_gpus=spec.gpus_per_trial, max_retries=0)(_finetune_task)
    if options:
        trial = trial.options(**options)
    task_ref = ray.put(task)
    grid = [Trial(seed=SEED_BASE + s, learning_rate=float(lr)) for lr in spec.learning_rates for s in range(spec.seeds)]
    return {trial.remote(model_dir, task_ref, t.seed, t.learning_rate, spec): t for t in grid}


def settle(ref: Any, t: Trial) -> str:
    """Put a finished trial's result (or its failure, with the reason) into `t`; a line saying which."""
    import ray

    try:
        t.result = ray.get(ref)
        return ", ".join(f"{k} {v:.4f}" for k, v in t.metrics.items())
    except Exception as exc:  # a failed trial: its reason, reported and left out of the mean
        cause = getattr(exc, "cause", None) or exc
        t.status, t.error = "failed", failure_line(cause)[0]
        return f"failed: {t.error}"


def run_trials(model_dir: str, task: Task, spec: FinetuneSpec) -> list[Trial]:
    """Every (seed, lr) pair as a Ray task on the connected cluster; failures kept with their reason."""
    import ray

    pending = submit_trials(model_dir, task, spec)
    grid = list(pending.values())
    while pending:  # as each trial ends: a progress line, so a long sweep is not silent
        [ref], _ = ray.wait(list(pending), num_returns=1)
        t = pending.pop(ref)
        what = settle(ref, t)
        log.info("trial %d/%d (lr %g, seed %d): %s", len(grid) - len(pending), len(grid), t.learning_rate, t.seed,
                 what)
    return grid


def record(metrics_dir: str, summary: Summary) -> None:
    """Append one `kind: downstream` record per trial to metrics_dir/metrics.jsonl (never replacing)."""
    from tpu_ray.metrics_stream import MetricsWriter

    writer = MetricsWriter(metrics_dir)
    for t in summary.trials:
        fields: dict[str, Any] = {"step": summary.step, "task": summary.task, "task_hash": summary.task_hash,
                                  "seed": t.seed, "learning_rate": t.learning_rate, "status": t.status,
                                  "metric": summary.metric}  # the task's headline metric, for summaries
        if t.status == "ok":
            fields.update(t.metrics)
            fields.update({k: t.result[k] for k in ("train_examples", "examples_per_s", "final_loss")})
        else:
            fields["error"] = t.error
        writer.write("downstream", **fields)
    writer.close()
