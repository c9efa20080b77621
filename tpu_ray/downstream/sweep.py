"""The seeds x learning-rates grid as parallel Ray tasks, its summary, and its records.

Why Ray tasks and not Ray Tune: the grid is fixed (no search algorithm, no early stopping); what Tune
would add here is retries, resume and tracking, and each comes cheaper from what tpu-ray already has.
A trial whose worker or node dies is retried by Ray's own task retries (`max_retries`, system failures
only: an error of the trial itself is reported, not repeated). An interrupted sweep resumes from the
trials already in metrics.jsonl (`recorded_trials`): the records are the sweep's state, so there is no
second store (Tune's experiment directory) to keep beside the run directory and in step with it. And
`eval.downstream` submits trials while training runs and collects them as they end, which a blocking
`Tuner.fit()` in the driver does not allow. A task per trial with `num_cpus`/`num_gpus` gives Tune's
parallelism and placement; resources no node has are refused before anything is submitted.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import statistics
import uuid
from dataclasses import dataclass, field
from typing import Any

from tpu_ray.cluster.autoscaler import cluster_autoscales
from tpu_ray.cluster.cpu_nodes import is_tpu_node
from tpu_ray.downstream.finetune import FinetuneSpec, finetune_trial
from tpu_ray.downstream.selection import choose_lr, spread
from tpu_ray.downstream.tasks import Task
from tpu_ray.errors import UserError, failure_line
from tpu_ray.logs import is_verbose, quiet_libraries

log = logging.getLogger("tpu_ray.downstream")
SEED_BASE = 0  # seeds are 0..N-1: the same N gives the same trials in every run
MAX_RETRIES = 3  # a trial whose worker process or node died is run again, up to this many times
# Fields of a trial's result that its record keeps beside the scores.
RESULT_FIELDS = ("best_epoch", "train_examples", "examples_per_s", "final_loss", "truncated_share")


@dataclass
class Trial:
    seed: int
    learning_rate: float
    status: str = "ok"  # "ok" or "failed"
    error: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    reused: bool = False  # taken from an earlier record of the same trial (a resumed sweep), not run again

    @property
    def metrics(self) -> dict[str, float]:
        """The validation scores (at the trial's best epoch)."""
        return self.result.get("scores", {}).get("validation", {})

    def score(self, split: str, metric: str) -> float:
        return float(self.result.get("scores", {}).get(split, {}).get(metric, math.nan))


def split_field(split: str, metric: str) -> str:
    """A score's name in a record: validation's plain (`accuracy`), another split's prefixed (`test_accuracy`)."""
    return metric if split == "validation" else f"{split}_{metric}"


@dataclass
class Summary:
    """One checkpoint's sweep on one task: every trial, the learning rate chosen on validation (the
    task's headline metric, mean over seeds), and the reported split's mean and sd at that rate."""

    task: str
    task_hash: str
    step: int | None
    trials: list[Trial]
    metric: str
    chance: float | None
    report_split: str = "validation"
    model: str = ""  # the checkpoint's fingerprint (finetune.model_fingerprint)
    label: str = ""  # what the verdict calls it
    settings: dict[str, Any] = field(default_factory=dict)
    settings_key: str = ""
    # (learning rate, seed) of finished trials recorded for this model, task and settings that this
    # sweep's grid does not hold: the report and compare count them, this summary does not
    not_counted: list[tuple[float, int]] = field(default_factory=list)
    records_dir: str = ""
    lineage: str = ""  # "" for a run's own checkpoints (one curve); a model's fingerprint outside its run
    export_dir: str = ""  # where each trial run now exported its model ("" : none)

    def by_lr(self) -> dict[float, list[Trial]]:
        out: dict[float, list[Trial]] = {}
        for t in self.trials:
            out.setdefault(t.learning_rate, []).append(t)
        return out

    def stats(self, lr: float, split: str = "validation") -> tuple[float, float, int]:
        """(mean, sample sd, n) of the headline metric on `split` over lr's finished seeds; sd 0 for one seed."""
        values = [t.score(split, self.metric) for t in self.by_lr()[lr] if t.status == "ok"]
        values = [v for v in values if math.isfinite(v)]
        if not values:
            return float("nan"), float("nan"), 0
        return math.fsum(values) / len(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values)

    @property
    def best_lr(self) -> float | None:
        """The learning rate with the best mean validation score: chosen on validation, never on test."""
        return choose_lr({lr: self.stats(lr)[0] for lr in self.by_lr() if self.stats(lr)[2]})

    def seed_scores(self) -> dict[int, float]:
        """seed -> the reported split's score at the chosen learning rate (for the paired verdict)."""
        best = self.best_lr
        return {} if best is None else {t.seed: t.score(self.report_split, self.metric)
                                        for t in self.by_lr()[best] if t.status == "ok"}

    def edge_warning(self) -> str | None:
        grid, best = sorted(self.by_lr()), self.best_lr
        if best is None or len(grid) < 2 or best not in (grid[0], grid[-1]):
            return None
        side, beyond = ("largest", best * 3) if best == grid[-1] else ("smallest", best / 3)
        return (f"warning: the chosen learning rate {best:g} is the grid's {side}: a better one may lie beyond it; "
                f"add {beyond:.0e} to finetune.learning_rates")

    def headline(self) -> str:
        """The reported split's score at the chosen learning rate, in one line."""
        best = self.best_lr
        if best is None:
            return f"{self.task}: every trial failed"
        mean, sd, n = self.stats(best, self.report_split)
        chance = f"; chance {self.chance:.4f}" if self.chance is not None else ""
        one = len(self.by_lr()) == 1  # nothing to choose: say so, never "chosen on validation"
        if self.report_split == "validation":
            where = ("the split the epoch was chosen on: optimistic" if one else
                     "the split the learning rate and epoch were chosen on: optimistic") + "; a test split gives a held-out figure"
        else:
            where = (f"held out; the only learning rate given, validation {self.stats(best)[0]:.4f}" if one else
                     f"held out; lr chosen on validation, {self.stats(best)[0]:.4f}")
        return (f"{self.task} {self.report_split} {self.metric}: {spread(mean, sd, n)} over {n} seed{'s' * (n != 1)} "
                f"at lr {best:g} ({where}{chance})")

    def lines(self) -> list[str]:
        out = []
        best = self.best_lr
        for lr, trials in sorted(self.by_lr().items()):
            mean, sd, n = self.stats(lr)
            mark = "  <- chosen on validation" if lr == best else ""
            out.append(f"  lr {lr:g}: validation {self.metric} {spread(mean, sd, n)} over {n} of {len(trials)} "
                       f"seeds{mark}")
            out += [f"    seed {t.seed} failed: {t.error}" for t in trials if t.status != "ok"]
        out.append(self.headline())
        if best is None:
            return out
        if self.not_counted:
            rates = sorted({lr for lr, _ in self.not_counted})
            out.append(f"note: {len(self.not_counted)} more finished trials of this model, task and settings are "
                       f"recorded (learning rates {', '.join(f'{x:g}' for x in rates)}) and not counted here; "
                       f"`tpu-ray report {self.records_dir}` counts them all")
        if warning := self.edge_warning():
            out.append(warning)
        cut = max((t.result.get("truncated_share", 0.0) for t in self.trials if t.status == "ok"), default=0.0)
        if cut > 0:
            used = max((t.result.get("max_length") or 0 for t in self.trials if t.status == "ok"), default=0)
            cap = f", capped at {used} by the model's positions" if used and used != self.settings.get("max_length") else ""
            out.append(f"note: {cut:.1%} of the examples are longer than {used or self.settings.get('max_length')} "
                       f"tokens (finetune.max_length={self.settings.get('max_length')}{cap}) and were cut")
        return out


def check_resources(spec: FinetuneSpec, nodes: list[dict[str, Any]], off_tpu: bool = False) -> None:
    """Refuse, before submitting, a trial no node of the cluster can hold: Ray would wait for ever.
    `off_tpu`: the trials are kept off TPU hosts (eval.downstream), so only the other nodes count."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive") and not (off_tpu and is_tpu_node(n))]
    if any(r.get("CPU", 0) >= spec.cpus_per_trial and r.get("GPU", 0) >= spec.gpus_per_trial for r in alive):
        return
    cpus = max((r.get("CPU", 0) for r in alive), default=0)
    gpus = max((r.get("GPU", 0) for r in alive), default=0)
    where = "no node of this Ray cluster off its TPU hosts" if off_tpu else "no node of this Ray cluster"
    raise UserError(f"finetune.cpus_per_trial={spec.cpus_per_trial:g}, finetune.gpus_per_trial="
                    f"{spec.gpus_per_trial:g}: {where} has that much (the largest has {cpus:g} "
                    f"CPUs, {gpus:g} GPUs), so the trials would wait for ever; ask for less, or start such a node")


def _finetune_task(model_dir: str, task: Task, seed: int, lr: float, spec: FinetuneSpec) -> dict[str, Any]:
    """One trial, in a Ray worker. Its export is written into a fresh directory beside the final one
    and renamed into place when complete: a failed trial leaves nothing, and a name taken when the
    trial ends (a directory, or a link planted there) is refused, not replaced. The check and the
    rename are two steps: the export directory is this sweep's own (run._check_export_dir), not a
    place two writers share."""
    quiet_libraries(is_verbose())  # TensorFlow's start-up lines in each worker, as in the driver
    if not spec.export_dir:
        return finetune_trial(model_dir, task, seed, lr, spec)
    final = os.path.join(spec.export_dir, export_name(lr, seed))
    partial = os.path.join(spec.export_dir, f".{export_name(lr, seed)}.partial-{uuid.uuid4().hex[:8]}")
    try:
        result = finetune_trial(model_dir, task, seed, lr, spec, save_to=partial)
        if os.path.lexists(final):
            raise RuntimeError(f"{final} appeared while the trial ran; the trial's model is not put over it")
        os.rename(partial, final)
        return result
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def export_name(lr: float, seed: int) -> str:
    return f"lr{lr:g}-seed{seed}"


def grid(spec: FinetuneSpec, learning_rates: list[float]) -> list[Trial]:
    return [Trial(seed=SEED_BASE + s, learning_rate=float(lr)) for lr in learning_rates for s in range(spec.seeds)]


def submit_trials(model_dir: str, task: Task, spec: FinetuneSpec, trials: list[Trial],
                  options: dict[str, Any] | None = None) -> dict[Any, Trial]:
    """Each trial that is not reused, as a Ray task on the connected cluster, started now: {ref: its
    Trial}. `options`: more Ray task options (eval.downstream keeps the trials off TPU hosts)."""
    import ray

    try:
        check_resources(spec, ray.nodes(), off_tpu=bool((options or {}).get("label_selector")))
    except UserError as exc:
        if not cluster_autoscales():
            raise
        log.warning("%s; this cluster autoscales, so the trials are submitted and wait for such a node "
                    "(`ray status` shows whether one is coming)", str(exc).split("; ask for less")[0])
    remote = ray.remote(num_cpus=spec.cpus_per_trial, num_gpus=spec.gpus_per_trial,
                        max_retries=MAX_RETRIES)(_finetune_task)
    if options:
        remote = remote.options(**options)
    task_ref = ray.put(task)
    return {remote.remote(model_dir, task_ref, t.seed, t.learning_rate, spec): t for t in trials if not t.reused}


def settle(ref: Any, t: Trial, metric: str) -> str:
    """Put a finished trial's result (or its failure, with the reason) into `t`; a line saying which."""
    import ray

    try:
        t.result = ray.get(ref)
    except Exception as exc:  # a failed trial: its reason, reported and left out of the mean
        cause = getattr(exc, "cause", None) or exc
        t.status, t.error = "failed", failure_line(cause)[0]
        return f"failed: {t.error}"
    return ", ".join(f"{split} {metric} {scores.get(metric, math.nan):.4f}"
                     for split, scores in t.result["scores"].items()) + f" (epoch {t.result['best_epoch']})"


def run_trials(model_dir: str, task: Task, spec: FinetuneSpec, trials: list[Trial]) -> list[Trial]:
    """The trials not reused, as Ray tasks on the connected cluster; failures kept with their reason."""
    import ray

    pending = submit_trials(model_dir, task, spec, trials)
    total, reused = len(pending), sum(t.reused for t in trials)
    if reused:
        log.info("%d of %d trials are recorded already (an earlier sweep of this checkpoint and settings): "
                 "kept, not run again", reused, len(trials))
    while pending:  # as each trial ends: a progress line, so a long sweep is not silent
        [ref], _ = ray.wait(list(pending), num_returns=1)
        t = pending.pop(ref)
        what = settle(ref, t, task.metrics[0])
        log.info("trial %d/%d (lr %g, seed %d): %s", total - len(pending), total, t.learning_rate, t.seed, what)
    return trials


def recorded_trials(records: list[dict[str, Any]], task: Task, model: str, settings_key: str) -> dict[tuple, Trial]:
    """{(learning rate, seed): Trial} of the finished trials already recorded for this task, checkpoint
    and settings (the first of each, as history.scores counts them): a rerun or a resumed sweep keeps
    them instead of counting the seed twice."""
    out: dict[tuple, Trial] = {}
    for r in records:
        if (r.get("kind") != "downstream" or r.get("status") != "ok" or r.get("task_hash") != task.digest()
                or r.get("model") != model or r.get("settings_key") != settings_key):
            continue
        key = (float(r["learning_rate"]), int(r["seed"]))
        if key in out:
            continue
        scores = {split: {m: _float(r.get(split_field(split, m))) for m in task.metrics} for split in task.eval_splits}
        if not all(split_field(s, m) in r for s in task.eval_splits for m in task.metrics) or not all(
                math.isfinite(scores[s][task.metrics[0]]) for s in task.eval_splits):
            continue  # a record without every score this task reports (or no headline number): run it again
        out[key] = Trial(seed=key[1], learning_rate=key[0], reused=True,
                         result={"scores": scores, **{k: r.get(k) for k in RESULT_FIELDS}})
    return out


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def record(metrics_dir: str, summary: Summary) -> None:
    """Append one `kind: downstream` record per trial run now to metrics_dir/metrics.jsonl (never
    replacing; a reused trial is recorded already): its identity (task hash, checkpoint, settings,
    learning rate, seed), every split's scores at its best epoch, and how it trained."""
    from tpu_ray.metrics_stream import MetricsWriter
    from tpu_ray.tracking.trackers import trackers_for_run_dir

    writer = MetricsWriter(metrics_dir, mirrors=trackers_for_run_dir(metrics_dir))  # the run's tracking.*
    for t in summary.trials:
        if t.reused:
            continue
        fields: dict[str, Any] = {"step": summary.step, "task": summary.task, "task_hash": summary.task_hash,
                                  "model": summary.model, "settings_key": summary.settings_key,
                                  **summary.settings, "seed": t.seed, "learning_rate": t.learning_rate,
                                  "status": t.status, "metric": summary.metric,  # the headline, for summaries
                                  "report_split": summary.report_split, "chance": summary.chance,
                                  "lineage": summary.lineage}
        if t.status == "ok":
            for split, scores in t.result["scores"].items():
                fields.update({split_field(split, m): v for m, v in scores.items()})
            fields.update({k: t.result[k] for k in RESULT_FIELDS})
            fields["max_length_used"] = t.result["max_length"]
            if summary.export_dir:  # this record's scores are the exported model's (history prefers it)
                fields["exported"] = os.path.join(summary.export_dir, export_name(t.learning_rate, t.seed))
        else:
            fields["error"] = t.error
        writer.write("downstream", **fields)
    writer.close()
