"""Downstream scores as history: the `kind: downstream` records of a run, summarised for the report
and set side by side for `compare` (runs are comparable on a task only when its data hash is equal)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from tpu_ray.downstream.tasks import DEFAULT_METRICS


def scores(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, task_hash, step, learning_rate): the headline metric's mean, sample sd and
    the number of finished and failed seeds. `df`: load_metrics' frame (any kinds)."""
    cols = ["task", "task_hash", "step", "learning_rate", "metric", "mean", "sd", "seeds", "failed"]
    if df.empty or "kind" not in df.columns or not (df["kind"] == "downstream").any():
        return pd.DataFrame(columns=cols)
    rows = []
    down = df[df["kind"] == "downstream"]
    keys = ["task", "task_hash", "step", "learning_rate", "metric"]
    for key, group in down.groupby(keys, dropna=False, sort=True):
        metric = key[4] if isinstance(key[4], str) else _headline(group)  # records written before `metric`
        ok = group[group["status"] == "ok"]
        values = pd.to_numeric(ok[metric], errors="coerce").dropna() if metric in ok.columns else pd.Series([])
        rows.append([*key[:4], metric, values.mean() if len(values) else float("nan"),
                     values.std(ddof=1) if len(values) > 1 else 0.0, len(values), int((group["status"] != "ok").sum())])
    return pd.DataFrame(rows, columns=cols)


def _headline(group: pd.DataFrame) -> str:
    names = [m for ms in DEFAULT_METRICS.values() for m in ms]
    return next((m for m in names if m in group.columns and group[m].notna().any()), names[0])


def best(df: pd.DataFrame) -> pd.DataFrame:
    """Per (task, task_hash, step): the learning rate with the highest mean."""
    table = scores(df).dropna(subset=["mean"])
    if table.empty:
        return table
    idx = table.groupby(["task", "task_hash", "step"], dropna=False)["mean"].idxmax()
    return table.loc[idx].reset_index(drop=True)


def score_text(r: pd.Series) -> str:
    """`metric mean ± sd (n seeds[, k failed], lr x)` of one row of `best`/`scores`."""
    failed = f", {r['failed']} failed" if r["failed"] else ""
    return f"{r['metric']} {r['mean']:.4f} ± {r['sd']:.4f} ({r['seeds']} seeds{failed}, lr {r['learning_rate']:g})"


def _line(r: pd.Series) -> str:
    step = "" if pd.isna(r["step"]) else f" at step {int(r['step'])}"
    return f"  {r['task']}{step}: {score_text(r)}"


def summary_lines(df: pd.DataFrame) -> list[str]:
    """The report's downstream lines: the best learning rate's mean ± sd per task and checkpoint step."""
    table = best(df)
    if table.empty:
        return []
    return ["downstream (fine-tuned, best learning rate):", *(_line(r) for _, r in table.iterrows())]


def comparison_lines(metrics: Sequence[pd.DataFrame], labels: Sequence[str]) -> list[str]:
    """Each task's best score per run (its latest step), marked not comparable where the data differs.
    `metrics`: each run's records as report.load_metrics gives them (the caller loads them: report
    imports this module, so this module does not import report)."""
    per_run = {label: best(df) for df, label in zip(metrics, labels)}
    tasks = sorted({t for table in per_run.values() for t in table["task"]})
    lines: list[str] = []
    for task in tasks:
        lines.append(f"downstream {task}:")
        hashes = set()
        for label, table in per_run.items():
            rows = table[table["task"] == task]
            if rows.empty:
                lines.append(f"  {label}: not fine-tuned on it")
                continue
            last = rows.sort_values("step", na_position="first").iloc[-1]
            hashes.add(last["task_hash"])
            lines.append(f"  {label}{_line(last)[len(task) + 2:]}")
        if len(hashes) > 1:
            lines.append(f"  not comparable: the runs were fine-tuned on different data for {task} "
                         f"(task hashes {', '.join(sorted(h[:12] for h in hashes))})")
    return lines
