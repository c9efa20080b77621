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
from tpu_ray.downstream.verdict import paired

CURVE = ["task", "task_hash", "settings_key"]  # one curve over checkpoint steps: one learning rate chosen
POINT = [*CURVE, "step", "model"]  # one checkpoint's sweep
IDENTITY = ["task_hash", "model", "settings_key", "learning_rate", "seed"]
UNRECORDED = "unrecorded"  # records written before the settings were: they group together


def trials(df: pd.DataFrame) -> pd.DataFrame:
    """The downstream records, one per trial identity (see the module docstring), with `score` (the
    reported split's headline) and `val_score` (validation's headline) as columns."""
    if df.empty or "kind" not in df.columns or not (df["kind"] == "downstream").any():
        return pd.DataFrame(columns=[*POINT, "learning_rate", "seed", "status", "metric", "split", "score",
                                     "val_score"])
    down = df[df["kind"] == "downstream"].copy()
    for col in ("model", "settings_key", "report_split", "metric", "chance"):
        if col not in down.columns:
            down[col] = None
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
    down = down.sort_values(["_ok", "_order"], ascending=[False, True]).drop_duplicates(IDENTITY, keep="first")
    return down.sort_values("_order").drop(columns=["_ok", "_order"])


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
    cols = [*POINT, "learning_rate", "metric", "split", "val_mean", "val_sd", "mean", "sd", "seeds", "failed", "chance"]
    t = trials(df)
    if t.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, group in t.groupby([*POINT, "learning_rate"], dropna=False, sort=True):
        ok = group[group["status"] == "ok"]
        n = len(ok)
        chance = pd.to_numeric(group["chance"], errors="coerce").dropna()
        rows.append([*key, group["metric"].iloc[-1], group["split"].iloc[-1],
                     ok["val_score"].mean() if n else math.nan, ok["val_score"].std(ddof=1) if n > 1 else 0.0,
                     ok["score"].mean() if n else math.nan, ok["score"].std(ddof=1) if n > 1 else 0.0,
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
    return float(pool.groupby("learning_rate")["val_mean"].mean().idxmax())


def best(df: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint sweep: the row at its curve's learning rate (chosen_lr)."""
    table = scores(df)
    if table.empty or table["val_mean"].isna().all():
        return table.iloc[0:0]
    out = []
    for _, curve in table.groupby(CURVE, dropna=False, sort=True):
        if curve["val_mean"].isna().all():
            continue
        lr = chosen_lr(curve)
        out.append(curve[curve["learning_rate"] == lr])
    return pd.concat(out).reset_index(drop=True)


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
    return (f"{r['split']} {r['metric']} {r['mean']:.4f} ± {r['sd']:.4f} ({r['seeds']} seeds{failed}, "
            f"lr {r['learning_rate']:g}{val}{chance})")


def _line(r: pd.Series) -> str:
    step = "" if pd.isna(r["step"]) else f" at step {int(r['step'])}"
    return f"  {r['task']}{step}: {score_text(r)}"


def summary_lines(df: pd.DataFrame) -> list[str]:
    """The report's downstream lines: per task and checkpoint step, the score at the curve's learning rate."""
    table = best(df)
    if table.empty:
        return []
    return ["downstream (fine-tuned; one learning rate per task, chosen on validation):",
            *(_line(r) for _, r in table.sort_values(["task", "step"], na_position="first").iterrows())]


def comparison_lines(metrics: Sequence[pd.DataFrame], labels: Sequence[str]) -> list[str]:
    """Each task's score per run (its latest checkpoint), and the first run against each other one:
    the difference paired by seed with its 95% interval, in words (downstream.verdict). Runs fine-tuned
    on different data or with other settings are marked not comparable, with no verdict.
    `metrics`: each run's records as report.load_metrics gives them (the caller loads them: report
    imports this module, so this module does not import report)."""
    per_run = {label: (df, best(df)) for df, label in zip(metrics, labels)}
    tasks = sorted({t for _, table in per_run.values() for t in table["task"]})
    lines: list[str] = []
    for task in tasks:
        lines.append(f"downstream {task}:")
        latest: dict[str, pd.Series] = {}
        for label, (_, table) in per_run.items():
            rows = table[table["task"] == task]
            if rows.empty:
                lines.append(f"  {label}: not fine-tuned on it")
                continue
            latest[label] = last = rows.sort_values("step", na_position="first").iloc[-1]
            lines.append(f"  {label}{_line(last)[len(task) + 2:]}")
        hashes = {r["task_hash"] for r in latest.values()}
        settings = {r["settings_key"] for r in latest.values()}
        if len(hashes) > 1:
            lines.append(f"  not comparable: the runs were fine-tuned on different data for {task} "
                         f"(task hashes {', '.join(sorted(h[:12] for h in hashes))})")
        elif len(settings) > 1:
            lines.append(f"  not comparable: the runs were fine-tuned with other settings for {task} (epochs, batch, "
                         f"max_length or examples; settings {', '.join(sorted(map(str, settings)))}): fine-tune them "
                         f"again with the same finetune.* options")
        elif len(latest) > 1:
            (base, b), *others = latest.items()
            for label, r in others:
                v = paired(base, seed_scores(per_run[base][0], b), label, seed_scores(per_run[label][0], r),
                           str(b["metric"]), str(b["split"]))
                lines.append(f"  verdict: {v.words()}")
    return lines
