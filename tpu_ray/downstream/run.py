"""`tpu_ray.finetune(...)` and `tpu-ray finetune`: check everything, sweep on Ray, record, summarise;
with two or more models, the paired verdict between the first and each other."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any

from tpu_ray.downstream.finetune import FinetuneSpec, default_learning_rates, model_fingerprint, resolve_model
from tpu_ray.downstream.sweep import Summary, export_name, grid, record, recorded_trials, run_trials
from tpu_ray.downstream.tasks import Task, load_task
from tpu_ray.downstream.verdict import Verdict, paired
from tpu_ray.errors import UserError
from tpu_ray.runlock import RunLock

log = logging.getLogger("tpu_ray.downstream")


@dataclass
class Target:
    """One model to fine-tune, resolved: where it is, where its records go, what it is called."""

    model_dir: str
    metrics_dir: str
    step: int | None
    label: str
    own_run: bool = False  # its records go to its own run directory: its checkpoints make one curve


def finetune(run_or_model: str, task: str, seeds: int | None = None, output_dir: str | None = None,
             overrides: dict[str, Any] | None = None) -> Summary:
    """Fine-tune a run's model (RUN or RUN/model, or any model directory) on `task` over seeds x
    learning rates, record each trial as `kind: downstream` in the run's metrics.jsonl (or in
    output_dir's, for a model outside a run), and return the summary. Bad input is refused here,
    before Ray starts or any model loads."""
    return finetune_models([run_or_model], task, seeds, output_dir, overrides)[0][0]


def finetune_models(models: list[str], task: str, seeds: int | None = None, output_dir: str | None = None,
                    overrides: dict[str, Any] | None = None) -> tuple[list[Summary], list[Verdict]]:
    """Each model swept in turn (each sweep uses the whole cluster) on the same task, seeds and settings;
    then the first model against each other one, paired by seed (downstream.verdict)."""
    values = dict(overrides or {})
    ray_values = {k: values.pop(k) for k in list(values) if k.startswith("ray.")}
    if seeds is not None:
        values["finetune.seeds"] = seeds
    spec = FinetuneSpec.from_overrides(values)
    if output_dir and os.path.isfile(output_dir):
        raise UserError(f"--output-dir {output_dir}: a file is in the way; give a directory for the records")
    targets = _targets(models, output_dir)
    loaded = load_task(task)
    if loaded.kind_obj.words:  # word ids: a fast tokenizer
        for t in targets:
            _check_fast_tokenizer(t.model_dir)
    grids = {t.model_dir: spec.learning_rates or _default_grid(t.model_dir) for t in targets}
    if spec.export_dir:
        _check_export_dir(spec, targets, grids)
    log.info("task %s (sha256 %s)", loaded.describe(), loaded.digest()[:12])
    with contextlib.ExitStack() as locks:  # one writer of each record directory at a time, before Ray starts
        for t in targets:
            os.makedirs(t.metrics_dir, exist_ok=True)
            locks.enter_context(RunLock(t.metrics_dir, "tpu-ray finetune"))
        _connect(ray_values)
        try:
            summaries = [_sweep(t, loaded, spec, grids[t.model_dir]) for t in targets]
        finally:
            if spec.export_dir:
                _remove_partial_exports(spec.export_dir)
    base = summaries[0]
    verdicts = [paired(base.label, base.seed_scores(), s.label, s.seed_scores(), base.metric, base.report_split)
                for s in summaries[1:]]
    return summaries, verdicts


def _sweep(target: Target, task: Task, spec: FinetuneSpec, learning_rates: list[float]) -> Summary:
    """One model's sweep (its record directory locked by the caller): the trials recorded already for
    this checkpoint and settings are kept, the others run and recorded."""
    from tpu_ray.metrics_stream import read_records

    model = model_fingerprint(target.model_dir)
    key = spec.settings_key()
    recorded = recorded_trials(read_records(target.metrics_dir), task, model, key)
    # With export_dir every trial runs: a recorded trial kept would export nothing (its model is gone).
    done = {} if spec.export_dir else recorded
    trials = [done.get((t.learning_rate, t.seed), t) for t in grid(spec, learning_rates)]
    others = sorted(set(recorded) - {(t.learning_rate, t.seed) for t in trials})
    log.info("%s: %d trials (%d seeds x learning rates %s)", target.label, len(trials), spec.seeds, learning_rates)
    run_trials(target.model_dir, task, spec, trials)
    summary = Summary(task=task.name, task_hash=task.digest(), step=target.step, trials=trials,
                      metric=task.metrics[0], chance=task.chance(), report_split=task.report_split,
                      model=model, label=target.label, settings=spec.settings(), settings_key=key,
                      not_counted=others, records_dir=target.metrics_dir,
                      lineage="" if target.own_run else model, export_dir=spec.export_dir)
    record(target.metrics_dir, summary)
    return summary


def _targets(models: list[str], output_dir: str | None) -> list[Target]:
    """Each model resolved; its records go to its run directory, else to --output-dir (a subdirectory
    per model when several are given, so no two models share one record file by accident)."""
    if not models:
        raise UserError("give at least one RUN_OR_MODEL to fine-tune")
    targets, labels = [], set()
    for m in models:
        model_dir, run_dir, step = resolve_model(m)
        name = os.path.basename(os.path.normpath(run_dir or (os.path.dirname(model_dir) if os.path.basename(
            os.path.normpath(model_dir)) == "model" else model_dir))) or "model"
        label, i = name, 2
        while label in labels:
            label, i = f"{name}-{i}", i + 1
        labels.add(label)
        if run_dir is not None and not output_dir:
            metrics_dir = run_dir
        elif output_dir:
            metrics_dir = output_dir if len(models) == 1 else os.path.join(output_dir, label)
        else:
            raise UserError(f"{m}: a model outside a run directory; give --output-dir for its records")
        targets.append(Target(model_dir, metrics_dir, step, label, own_run=metrics_dir == run_dir))
    if len({t.model_dir for t in targets}) < len(targets):
        raise UserError("the same model is given twice; give each model once")
    return targets


def _default_grid(model_dir: str) -> list[float]:
    lrs, why = default_learning_rates(model_dir)
    log.info("%s: learning rates %s (%s; set finetune.learning_rates to choose)", model_dir, lrs, why)
    return lrs


def _check_export_dir(spec: FinetuneSpec, targets: list[Target], grids: dict[str, list[float]]) -> None:
    """Refuse, before anything runs, an export directory that is a link, or that holds a model a trial
    of this sweep would write: an earlier sweep's models are never replaced."""
    if len(targets) > 1:
        raise UserError("finetune.export_dir takes one model; fine-tune the models to export one at a time")
    where = spec.export_dir
    if os.path.islink(where) or (os.path.exists(where) and not os.path.isdir(where)):
        raise UserError(f"finetune.export_dir={where}: {'a link' if os.path.islink(where) else 'a file'}; give a "
                        f"plain directory (new, or holding no model of this grid)")
    if not os.path.isdir(where):
        os.makedirs(where)
        return
    names = {export_name(lr, s) for lr in grids[targets[0].model_dir] for s in range(spec.seeds)}
    taken = sorted(n for n in os.listdir(where) if n in names)
    if taken:
        raise UserError(f"finetune.export_dir={where}: holds {taken[0]} (and {len(taken) - 1} more) from an earlier "
                        f"sweep; give a new directory or move them away (they are never replaced)")


def _remove_partial_exports(where: str) -> None:
    """A trial whose worker died mid-export leaves its hidden `.NAME.partial-*` directory behind (its
    own clean-up never ran; Ray ran the trial again elsewhere): removed once the sweep ends, while the
    record directory's lock is still held, so no half-written model stays in the export directory."""
    import shutil

    for name in os.listdir(where) if os.path.isdir(where) else []:
        if name.startswith(".") and ".partial-" in name:
            shutil.rmtree(os.path.join(where, name), ignore_errors=True)
            log.info("%s: removed %s, the partial export of a trial whose worker died", where, name)


def _check_fast_tokenizer(model_dir: str) -> None:
    """A token task reads word ids from the tokenizer: refuse a slow one here, not in every trial."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
    except Exception as exc:  # no tokenizer files: one line, not a traceback per trial
        raise UserError(f"{model_dir}: no tokenizer loads from it ({type(exc).__name__}); a token task needs "
                        f"the model's tokenizer beside it") from None
    if not tok.is_fast:
        raise UserError(f"{model_dir}: its tokenizer ({type(tok).__name__}) is not a fast one; token classification "
                        f"needs word ids, which only fast tokenizers (tokenizer.json) give")


def _connect(ray_values: dict[str, Any]) -> None:
    from tpu_ray.cluster.connect import ensure_ray
    from tpu_ray.config import RunConfig

    unknown = sorted(set(ray_values) - {"ray.address", "ray.num_cpus"})
    if unknown:
        raise UserError(f"{unknown[0]}: unknown option; fine-tuning takes ray.address and ray.num_cpus")
    ensure_ray((RunConfig().override(ray_values) if ray_values else RunConfig()).ray)
