"""Downstream scores as history: the `kind: downstream` records of a run, counted once each, grouped by
what changes a score, the learning rate chosen on validation, and runs set side by side with a verdict.

Each trial counts once: its identity is (task hash, checkpoint, settings, learning rate, seed), and
of several records of one identity the first finished one is kept (the one the sweep that ran it
reported; a later record of the same trial, from a sweep run again by hand, adds no information,
and counting it would shrink the standard deviation with a seed counted twice). Scores group by the
settings that change them (epochs, batch, max_length, examples, warm-up, weight decay: the
`settings_key`), so a quick check is never averaged with a full sweep."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from tpu_ray.downstream.tasks import DEFAULT_METRICS
from tpu_ray.downstream.selection import choose_lr, mean_of as _mean, spread  # noqa: F401 - spread re-exported
from tpu_ray.downstream.verdict import paired

# One curve over checkpoint steps (one learning rate chosen): keyed by the task's hash, never its name
# (one task named by two paths is one task); `lineage` keeps models outside a run apart (sweep.record).
CURVE = ["task_hash", "settings_key", "metric", "lineage"]
POINT = [*CURVE, "step", "model"]  # one checkpoint's sweep
IDENTITY = ["task_hash", "model", "settings_key", "learning_rate", "seed"]
UNRECORDED = "unrecorded"  # records written before the settings were: they group together


def trials(df: pd.DataFrame) -> pd.DataFrame:
    """The downstream records, one per trial identity (see the module docstring), with `score` (the
    reported split's headline) and `val_score` (validation's headline) as columns."""
    if df.empty or "kind" not in df.columns or not (df["kind"] == "downstream").any():
        return pd.DataFrame(columns=[*POINT, "task", "learning_rate", "seed", "status", "split", "score",
                                     "val_score"])
    down = df[df["kind"] == "downstream"].copy()
    for col in ("model", "settings_key", "report_split", "metric", "chance", "lineage", "exported"):
        if col not in down.columns:
            down[col] = None
    down["lineage"] = down["lineage"].fillna("")  # records from before lineage was recorded: the run's curve
    down["_exported"] = down["exported"].notna()
    down["settings_key"] = down["settings_key"].fillna(UNRECORDED)
    # a record from before checkpoints were fingerprinted: its step names the checkpoint within the run
    down["model"] = down["model"].fillna(down["step"].map(lambda s: f"step-{s}"))
    down["split"] = down["report_split"].fillna("validation")
    down["metric"] = [m if isinstance(m, str) else _headline(down) for m in down["metric"]]
    down["val_score"] = [_number(r.get(r["metric"])) for _, r in down.iterrows()]
    down["score"] = [_number(r.get(r["metric"] if r["split"] == "validation" else f"{r['split']}_{r['metric']}"))
                     for _, r in down.iterrows()]
    # one rule for a score that is not a number, as sweep.Summary applies it: the trial failed
    bad = (down["status"] == "ok") & ~(down["score"].map(math.isfinite) & down["val_score"].map(math.isfinite))
    down.loc[bad, "status"] = "failed"
    down["_ok"] = down["status"] == "ok"
    down["_order"] = range(len(down))
    # of one identity: a finished record first, one whose model was exported before others (its score is
    # the exported model's), then the earliest
    down = down.sort_values(["_ok", "_exported", "_order"], ascending=[False, False, True]).drop_duplicates(
        IDENTITY, keep="first")
    return down.sort_values("_order").drop(columns=["_ok", "_exported", "_order"])


def _number(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _headline(group: pd.DataFrame) -> str:
    names = [m for ms in DEFAULT_METRICS.values() for m in ms]
    return next((m for m in names if m in group.columns and group[m].notna().any()), names[0])


def scores(df: pd.DataFrame) -> pd.DataFrame:
    """One row per checkpoint sweep and learning rate: validation's mean and sd, the reported split's
    mean and sd (test where the task has one), seeds finished and failed."""
    cols = [*POINT, "learning_rate", "task", "split", "val_mean", "val_sd", "mean", "sd", "seeds", "failed", "chance"]
    t = trials(df)
    if t.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, group in t.groupby([*POINT, "learning_rate"], dropna=False, sort=True):
        ok = group[group["status"] == "ok"]
        n = len(ok)
        chance = pd.to_numeric(group["chance"], errors="coerce").dropna()
        rows.append([*key, group["task"].iloc[-1], group["split"].iloc[-1],
                     _mean(ok["val_score"]), ok["val_score"].std(ddof=1) if n > 1 else 0.0,
                     _mean(ok["score"]), ok["score"].std(ddof=1) if n > 1 else 0.0,
                     n, int(len(group) - n), chance.iloc[-1] if len(chance) else math.nan])
    return pd.DataFrame(rows, columns=cols)


def chosen_lr(table: pd.DataFrame) -> float:
    """One curve's learning rate, chosen on validation once for all its checkpoints: the best mean
    validation score averaged over the steps, among the rates every step ran (all, if none did).
    Choosing again at every step would report a maximum over noisy means at each point."""
    done = table.dropna(subset=["val_mean"])
    points = done.groupby(["step", "model"], dropna=False).ngroups
    every = done.groupby("learning_rate").filter(lambda g: len(g) == points)
    pool = every if not every.empty else done
    return choose_lr({lr: _mean(g["val_mean"]) for lr, g in pool.groupby("learning_rate")})


def best(df: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint sweep: the row at its curve's learning rate (chosen_lr). Where one step of a
    curve holds several models' sweeps (models outside a run fine-tuned into one --output-dir), they
    are not one model's curve: each sweep takes the rate best on its own validation, and `lineage`
    names its model (empty for a run's own curve), so lines and plots keep them apart."""
    table = scores(df)
    if table.empty or table["val_mean"].isna().all():
        return table.iloc[0:0]
    out = []
    for _, curve in table.groupby(CURVE, dropna=False, sort=True):
        if curve["val_mean"].isna().all():
            continue
        if curve.groupby("step", dropna=False)["model"].nunique().max() > 1:
            out += [point_best(p).assign(lineage=p["model"].iloc[0])
                    for _, p in curve.groupby(["step", "model"], dropna=False) if p["val_mean"].notna().any()]
            continue
        lr = chosen_lr(curve)
        out.append(curve[curve["learning_rate"] == lr].assign(task=curve["task"].iloc[-1]))  # its latest name
    table = pd.concat(out).reset_index(drop=True)
    # a model is named in lines and plots where one task and settings hold several models' curves
    several = table.groupby(["task_hash", "settings_key"])["lineage"].transform("nunique") > 1
    return table.assign(shown_model=table["lineage"].where(several, ""))


def point_best(point: pd.DataFrame) -> pd.DataFrame:
    """One checkpoint sweep's row at the rate best on its own validation (as `tpu-ray finetune` chooses)."""
    lr = choose_lr(dict(zip(point["learning_rate"], point["val_mean"])))
    return point[point["learning_rate"] == lr]


def latest(df: pd.DataFrame) -> dict[tuple[str, str], pd.Series | str]:
    """{(task hash, settings key): the latest checkpoint's row at the rate best on its own validation,
    the choice `tpu-ray finetune` made for it (so compare never reverses finetune's verdict), or a
    line saying why there is none}."""
    table = scores(df)
    out: dict[tuple[str, str], pd.Series | str] = {}
    for key, group in table.dropna(subset=["val_mean"]).groupby(["task_hash", "settings_key"], sort=True):
        steps = group["step"].dropna()
        last = group[group["step"] == steps.max()] if len(steps) else group
        models = last["model"].unique()
        lineages = {x for x in group["lineage"] if x}  # models outside a run, each recorded as its own
        if len(models) > 1 or len(lineages) > 1:
            many = sorted(set(models) | lineages)
            out[key] = (f"{len(many)} models' trials in one record directory ({', '.join(many)}); "
                        f"fine-tune each model into its own --output-dir to compare them")
            continue
        out[key] = point_best(last).iloc[0]
    return out


def seed_scores(df: pd.DataFrame, row: pd.Series) -> dict[int, float]:
    """seed -> the reported split's score, for one row of `best` (its sweep and learning rate)."""
    t = trials(df)
    mine = t[(t["status"] == "ok") & (t["learning_rate"] == row["learning_rate"])]
    for col in POINT:
        mine = mine[mine[col].isna()] if pd.isna(row[col]) else mine[mine[col] == row[col]]
    return {int(r["seed"]): float(r["score"]) for _, r in mine.iterrows()}


def score_text(r: pd.Series) -> str:
    """`split metric mean ± sd (n seeds[, k failed], lr x[, validation v])` of one row of `best`/`scores`."""
    failed = f", {r['failed']} failed" if r["failed"] else ""
    val = f"; validation {r['val_mean']:.4f}, the lr chosen on it" if r["split"] != "validation" else \
        "; on validation, the split the lr was chosen on"
    chance = f"; chance {r['chance']:.4f}" if not pd.isna(r.get("chance")) else ""
    return (f"{r['split']} {r['metric']} {spread(r['mean'], r['sd'], int(r['seeds']))} "
            f"({_seeds(int(r['seeds']))}{failed}, lr {r['learning_rate']:g}{val}{chance})")


def _seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def _line(r: pd.Series) -> str:
    step = "" if pd.isna(r["step"]) else f" at step {int(r['step'])}"
    model = f" (model {r['shown_model']})" if r.get("shown_model") else ""
    return f"  {r['task']}{step}{model}: {score_text(r)}"


def summary_lines(df: pd.DataFrame) -> list[str]:
    """The report's downstream lines: per task and checkpoint step, the score at the curve's learning rate."""
    table = best(df)
    if table.empty:
        return []
    return ["downstream (fine-tuned; one learning rate per task, chosen on validation):",
            *(_line(r) for _, r in table.sort_values(["task", "step"], na_position="first").iterrows())]


def comparison_lines(metrics: Sequence[pd.DataFrame], labels: Sequence[str]) -> list[str]:
    """Each task's score per run (its latest checkpoint, at the rate chosen on that checkpoint's own
    validation), and the first run against each other one: the difference paired by seed with its
    95% interval, in words (downstream.verdict). Tasks are matched by their hash (the same data, classes
    and metrics, whatever path named them); runs fine-tuned on other data or with other settings are
    said not comparable, with no verdict.
    `metrics`: each run's records as report.load_metrics gives them (the caller loads them: report
    imports this module, so this module does not import report)."""
    per_run = {label: (df, latest(df)) for df, label in zip(metrics, labels)}
    groups: dict[tuple[str, str], dict[str, pd.Series | str]] = {}
    for label, (_, points) in per_run.items():
        for key, row in points.items():
            groups.setdefault(key, {})[label] = row
    names = {key: _task_name(rows) for key, rows in groups.items()}
    lines: list[str] = []
    for key in sorted(groups, key=lambda k: (names[k], k)):
        rows = groups[key]
        twins = [k for k in groups if names[k] == names[key] and k != key]
        lines.append(f"downstream {names[key]}" + (f" (task {key[0][:12]}, settings {key[1]})" if twins else "") + ":")
        for label in labels:
            row = rows.get(label)
            if isinstance(row, str):
                lines.append(f"  {label}: {row}")
            elif row is not None:
                lines.append(f"  {label}{_line(row)[len(str(row['task'])) + 2:]}")
            elif not any(label in groups[k] for k in twins):
                lines.append(f"  {label}: not fine-tuned on it")
        ready = [(label, r) for label in labels if isinstance(r := rows.get(label), pd.Series)]
        if len({str(r["metric"]) for _, r in ready}) > 1:
            lines.append("  not comparable: the runs report different metrics for it; fine-tune them again with the "
                         "same task")
        elif len(ready) > 1:
            (base, b), *others = ready
            for label, r in others:
                v = paired(base, seed_scores(per_run[base][0], b), label, seed_scores(per_run[label][0], r),
                           str(b["metric"]), str(b["split"]))
                lines.append(f"  verdict: {v.words()}")
    for name in sorted(set(names.values())):
        keys = [k for k in groups if names[k] == name]
        if len(keys) < 2 or any(sum(isinstance(r, pd.Series) for r in groups[k].values()) > 1 for k in keys):
            continue  # one group, or one the runs share (compared above): nothing to explain
        if len({h for h, _ in keys}) > 1:
            lines.append(f"downstream {name}: not comparable: the runs were fine-tuned on different "
                         f"data, classes or metrics (task hashes {', '.join(sorted({h[:12] for h, _ in keys}))})")
        else:
            lines.append(f"downstream {name}: not comparable: the runs were fine-tuned with other "
                         f"settings (epochs, batch, max_length or examples; settings {', '.join(sorted(k for _, k in keys))}): "
                         f"fine-tune them again with the same finetune.* options")
    return lines


def _task_name(rows: dict[str, pd.Series | str]) -> str:
    found = sorted({str(r["task"]) for r in rows.values() if isinstance(r, pd.Series)})
    return " / ".join(found) if found else "?"
