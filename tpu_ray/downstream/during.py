"""eval.downstream: fine-tune the model on tasks while it trains, so a run shows its downstream curve
as it goes.

The trainer writes the model at each task's steps to RUN/downstream/step-N/model (its `Snapshot`
hook, train/loop_hooks.py; config.json written last) and goes on; the driver, which waits for the
training anyway, watches for those snapshots and fine-tunes each as Ray tasks on CPU nodes (never on a TPU
host, never inside the training step), then records each trial as `kind: downstream` at step N.
Why the driver and not the trainer: the trainer may run on a TPU host in a remote task or as Ray
Train workers, and it must not wait for fine-tuning; the run directory is shared by then anyway.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from tpu_ray import rundir, storage
from tpu_ray.config import DownstreamEval
from tpu_ray.downstream.finetune import FinetuneSpec, default_learning_rates, model_fingerprint
from tpu_ray.downstream.sweep import Summary, Trial, grid, record, recorded_trials, settle, submit_trials
from tpu_ray.downstream.tasks import Task, load_task
from tpu_ray.errors import UserError
from tpu_ray.metrics_stream import read_records
from tpu_ray.cluster.cpu_nodes import off_tpu_options

log = logging.getLogger("tpu_ray.downstream")
POLL_S = 5.0


@dataclass
class Planned:
    """One eval.downstream entry, checked: its task read and its fine-tuning options resolved."""

    index: int
    every: int
    task: Task
    spec: FinetuneSpec


def check_downstream(downstream: list[DownstreamEval]) -> list[Planned]:
    """Every eval.downstream entry's task and options, read and checked before any stage runs: a
    missing task file or an unknown option fails in one line naming the entry, not after training."""
    planned = []
    for i, entry in enumerate(downstream):
        where = f"eval.downstream[{i}]"
        options = {f"finetune.{k}": v for k, v in entry.finetune.items()}
        if "finetune.seeds" in options:
            raise UserError(f"{where}.finetune.seeds: give the seeds as {where}.seeds")
        if options.get("finetune.export_dir"):  # every snapshot's trials would write the same names
            raise UserError(f"{where}.finetune.export_dir: not taken during training; export a snapshot's fine-tuned "
                            f"models afterwards with tpu-ray finetune RUN/downstream/step-N/model "
                            f"finetune.export_dir=DIR")
        options["finetune.seeds"] = entry.seeds
        try:
            spec = FinetuneSpec.from_overrides(options)
            task = load_task(entry.task)
        except UserError as exc:
            raise UserError(f"{where}: {exc}") from None
        planned.append(Planned(i, entry.every, task, spec))
    return planned


class DuringTraining:
    """Watches RUN/downstream/ for snapshots while training runs and fine-tunes each one; `close()`
    (after training) takes the last snapshots, waits for every trial and records them. `last_step`:
    the run's train.steps, where every entry fine-tunes whatever its `every`."""

    def __init__(self, run_dir: str, last_step: int, planned: list[Planned], poll_s: float = POLL_S):
        self.run_dir, self.last_step, self.planned, self.poll_s = run_dir, last_step, planned, poll_s
        self._seen: set[int] = set()
        self._pending: dict[tuple[int, int], dict[Any, Trial]] = {}  # (step, entry) -> running trials
        self._grids: dict[tuple[int, int], list[Trial]] = {}
        self._options: dict[str, Any] | None = None  # Ray options of the trials, asked once
        self._started: set[tuple[int, int]] = set()  # (step, entry) whose trials were submitted
        self._models: dict[int, str] = {}  # step -> its snapshot's fingerprint, taken when its trials start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tpu-ray-downstream", daemon=True)
        self._lock = threading.Lock()
        self.summaries: list[Summary] = []  # what this run recorded, in the order the trials ended

    def __enter__(self) -> DuringTraining:
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is None:
            self.close()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - the training goes on; close() tries again and raises
                log.warning("eval.downstream: %s", exc)

    def poll(self, wait: bool = False) -> None:
        """Start the trials of new snapshots; record the (step, task) pairs whose trials all ended."""
        with self._lock:
            for step in self._new_snapshots():
                self._start(step)
            self._collect(wait)

    def close(self) -> None:
        """The snapshots written at the end, then every trial to its end, recorded."""
        self.poll(wait=True)

    def _new_snapshots(self) -> list[int]:
        root = rundir.path(self.run_dir, rundir.DOWNSTREAM_DIR)
        if not storage.exists(root):
            return []
        found = []
        for name in storage.listdir(root):
            step = rundir.snapshot_step(name)
            if step is None or step in self._seen:
                continue
            if storage.exists(rundir.path(rundir.snapshot_dir(self.run_dir, step), rundir.MODEL_DIR, "config.json")):
                found.append(step)
        return sorted(found)

    def due(self, step: int) -> list[Planned]:
        """The entries that fine-tune the snapshot at `step`: at their `every` and at the run's last
        step, unless this attempt started them already."""
        return [p for p in self.planned if (step % p.every == 0 or step == self.last_step)
                and (step, p.index) not in self._started]

    def _start(self, step: int) -> None:
        """Submit the snapshot's due entries; the step counts as seen only once all are submitted, so a
        failed submission (the cluster busy, a node gone) is tried again at the next poll or at close().
        Trials an earlier attempt of this run recorded (same snapshot weights, task and settings, finished)
        are kept, not run again; failed ones run again."""
        model_dir = rundir.path(rundir.snapshot_dir(self.run_dir, step), rundir.MODEL_DIR)
        due = self.due(step)
        records = read_records(self.run_dir) if due else []
        model = model_fingerprint(model_dir) if due else ""
        self._models[step] = model
        for p in due:
            done = recorded_trials(records, p.task, model, p.spec.settings_key())
            trials = [done.get((t.learning_rate, t.seed), t)
                      for t in grid(p.spec, p.spec.learning_rates or default_learning_rates(model_dir)[0])]
            if all(t.reused for t in trials):
                self._started.add((step, p.index))
                log.info("eval.downstream: the step-%d model on %s is recorded already", step, p.task.name)
                continue
            if self._options is None:
                self._options = _off_tpu_hosts()
            pending = submit_trials(model_dir, p.task, p.spec, trials, self._options)
            self._pending[(step, p.index)] = pending
            self._grids[(step, p.index)] = trials
            self._started.add((step, p.index))
            log.info("eval.downstream: fine-tuning the step-%d model on %s (%d trials)", step, p.task.name,
                     len(pending))
        self._seen.add(step)

    def _collect(self, wait: bool) -> None:
        import ray

        for key in sorted(self._pending):
            pending = self._pending[key]
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=None if wait else 0)
            for ref in ready:
                t = pending.pop(ref)
                settle(ref, t, t_metric(self.planned, key[1]))
            if not pending:
                del self._pending[key]
                self._record(*key)

    def _record(self, step: int, index: int) -> None:
        p = next(x for x in self.planned if x.index == index)
        summary = Summary(task=p.task.name, task_hash=p.task.digest(), step=step, trials=self._grids.pop((step, index)),
                          metric=p.task.metrics[0], chance=p.task.chance(), report_split=p.task.report_split,
                          model=self._models[step], label=f"step {step}", settings=p.spec.settings(),
                          settings_key=p.spec.settings_key())
        record(self.run_dir, summary)
        self.summaries.append(summary)
        log.info("eval.downstream @ step %d: %s", step, summary.headline())


def t_metric(planned: list[Planned], index: int) -> str:
    """The headline metric of eval.downstream entry `index` (for the progress line)."""
    return next(p for p in planned if p.index == index).task.metrics[0]


def _off_tpu_hosts() -> dict[str, Any]:
    """Ray options that keep the trials off TPU hosts (their TPU belongs to the training)."""
    import ray

    return off_tpu_options(ray.nodes())
