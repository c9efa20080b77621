"""Plain-text views of a run for a terminal: the end-of-run summary and the `tpu-ray metrics` table.

Both fit 80 columns and say each number once; the full data stays in `metrics.jsonl`,
`summary.json` (and `tpu-ray metrics --all` / `--csv`).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import pandas as pd

WIDTH = 80

# Columns worth a glance, per record kind, with their heading and format.
TABLE_COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "train": [("loss", "loss", ".4f"), ("accuracy", "acc", ".3f"), ("learning_rate", "lr", ".2e"),
              ("step_time_s", "ms/step", "ms"), ("tokens_per_s", "tokens/s", ",.0f"), ("mfu", "mfu", ".1%")],
    "eval": [("eval_loss", "eval_loss", ".4f"), ("eval_accuracy", "eval_acc", ".3f"),
             ("perplexity", "perplexity", ".2f"), ("bits_per_byte", "bits/byte", ".3f")],
    # Each source's own evaluation (a mixture's domain, replay and evaluation-only sets).
    "eval_source": [("eval_loss", "eval_loss", ".4f"), ("eval_accuracy", "eval_acc", ".3f"),
                    ("perplexity", "perplexity", ".2f"), ("bits_per_byte", "bits/byte", ".3f")],
    "event": [("event", "event", ""), ("stage", "stage", ""), ("seconds", "seconds", ".1f")],
}
TABLE_COLUMNS["eval_rerun"] = TABLE_COLUMNS["eval"]  # `tpu-ray eval` records, in rows of their own kind
# `tpu-ray finetune`: one row per (seed, learning rate) trial, at the checkpoint's step.
TABLE_COLUMNS["downstream"] = [
    ("task", "task", ""), ("seed", "seed", ".0f"), ("learning_rate", "lr", ".2e"), ("status", "status", ""),
    ("accuracy", "acc", ".3f"), ("macro_f1", "macro_f1", ".3f"), ("matthews", "matthews", ".3f"),
    ("f1", "f1", ".3f"), ("pearson", "pearson", ".3f"), ("spearman", "spearman", ".3f"),
    ("entity_f1", "entity_f1", ".3f"), ("token_accuracy", "token_acc", ".3f")]


def strategy_name(name: str | None) -> str:
    """A user's name for a tf.distribute strategy class (the CPU one is private in TensorFlow)."""
    if not name:
        return "n/a"
    if name == "_DefaultDistributionStrategy":
        return "default (one device)"
    return name.lstrip("_")


def mfu_text(mfu: float | None, kind: str | None, device: str | None) -> str:
    """MFU only against a known hardware peak; otherwise say why there is none."""
    if mfu is not None and math.isfinite(mfu):
        return f"{mfu:.1%}"
    if kind == "cpu" or device == "cpu":
        return "n/a on CPU (no known peak; set train.peak_flops)"
    return f"n/a (no known peak for {device or 'this device'}; set train.peak_flops)"


def _num(v: Any, spec: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)) or v is pd.NA:
        return ""
    if spec == "ms":
        return f"{float(v) * 1e3:.1f}"
    if spec:
        return format(float(v) if spec[-1] in "fe%" else v, spec)
    return str(v)


def _local_times(times: pd.Series) -> list[str]:
    """Local wall-clock times; the date too when the rows span more than one day."""
    if not len(times):
        return []
    tz = datetime.now().astimezone().tzinfo
    local = pd.to_datetime(times, utc=True).dt.tz_convert(tz)
    fmt = "%H:%M:%S" if local.dt.date.nunique() <= 1 else "%Y-%m-%d %H:%M:%S"
    return ["" if pd.isna(t) else t.strftime(fmt) for t in local]


def metrics_table(df: pd.DataFrame, all_columns: bool = False, tail: int = 0) -> str:
    """The last `tail` rows (0: all) of `df` (load_metrics' frame) as a readable table.

    Default: step, time and the columns that matter for the kinds present (events are left out
    when there are train or eval records), empty columns dropped. `all_columns`: every column.
    """
    if df.empty:
        return "no metrics records yet"
    out = df.copy()
    kinds = [k for k in ("train", "eval", "eval_source", "eval_rerun", "event", "downstream") if (out["kind"] == k).any()]
    if not all_columns and ("train" in kinds or "eval" in kinds):
        kinds = [k for k in kinds if k != "event"]
        out = out[out["kind"].isin(kinds)]
    if tail:
        out = out.tail(tail)
    if not all_columns:
        table = pd.DataFrame(index=out.index)
        if len(kinds) > 1:
            table["kind"] = out["kind"]
        table["step"] = out["step"].astype("string").fillna("")
        table["time"] = _local_times(out["time"])
        if "eval_source" in kinds:  # whose evaluation a row is, before the figures
            table["source"] = out["source"].astype("string").fillna("")
        for kind in kinds:
            for col, head, spec in TABLE_COLUMNS[kind]:
                if col in out.columns and out[col].notna().any():
                    table[head] = [_num(v, spec) for v in out[col]]
        return _rstrip(table.to_string(index=False))
    out["time"] = _local_times(out["time"])
    out = out.dropna(axis=1, how="all")
    return _rstrip(out.astype("object").where(out.notna(), "").to_string(index=False))


def _rstrip(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines())


# Shared with tpu_ray.report (the HTML report's numbers are the same).

def by_step(df: pd.DataFrame) -> pd.DataFrame:
    """One row per step, the latest record winning (a resumed run re-logs steps after its checkpoint)."""
    if df.empty:
        return df
    return df.drop_duplicates("step", keep="last").sort_values("step", kind="mergesort")


def column_values(df: pd.DataFrame, name: str) -> pd.Series:
    if name not in df.columns:
        return pd.Series(dtype="float64")
    return pd.to_numeric(df[name], errors="coerce")


def last_value(df: pd.DataFrame, name: str) -> float | None:
    s = column_values(df, name).dropna()
    return float(s.iloc[-1]) if len(s) else None


def last_finite_row(df: pd.DataFrame, name: str) -> dict[str, Any]:
    """The last row whose `name` is a finite number, as a dict ({} if none): its step and the other
    columns come from that same record, so a figure is never paired with a newer record's step."""
    values = column_values(df, name)
    ok = values[values.notna() & values.abs().ne(float("inf"))]
    return df.loc[ok.index[-1]].to_dict() if len(ok) else {}


def diverged_step(df: pd.DataFrame) -> int | None:
    """The first step whose loss was not finite (a `nonfinite` event), None if the run never diverged."""
    if df.empty or "event" not in df.columns:
        return None
    steps = column_values(df[(df["kind"] == "event") & (df["event"] == "nonfinite")], "step").dropna()
    return int(steps.min()) if len(steps) else None


def median_value(df: pd.DataFrame, name: str) -> float | None:
    s = column_values(df, name).dropna()
    return float(s.median()) if len(s) else None


def _fmt(v: Any, spec: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec) if spec else str(v)


def _started(df: pd.DataFrame, resumed: int) -> str:
    """Where the steps began when not at 0: a branch (train.branch_from) starts at its stable run's
    step, which is no resume of this run; a resumed branch says both."""
    branched = df[(df["kind"] == "event") & (df["event"] == "branch")] if len(df) and "event" in df.columns else df
    at = int(branched.iloc[-1]["step"]) if len(branched) else None
    if at is not None:
        return f" (branched from step {at}" + (f", resumed at {resumed})" if resumed and resumed != at else ")")
    return f" (resumed at {resumed})" if resumed else ""


def summary_rows(df: pd.DataFrame, summary: dict) -> list[tuple[str, str]]:
    """(label, value) rows of the end-of-run summary: each number once, no internal names."""
    train = by_step(df[df["kind"] == "train"]) if len(df) else df
    ev = by_step(df[df["kind"] == "eval"]) if len(df) else df
    start = {}
    if len(df) and "event" in df.columns:
        starts = df[(df["kind"] == "event") & (df["event"] == "train_start")]
        if len(starts):
            start = starts.iloc[-1].to_dict()
    steps = pd.concat([column_values(train, "step"), column_values(ev, "step")]).dropna()
    rows: list[tuple[str, str]] = []
    final = summary.get("steps", int(steps.max()) if len(steps) else None)
    resumed = summary.get("resumed_from") or 0
    rows.append(("steps", _fmt(final) + _started(df, resumed)))
    tr = last_finite_row(train, "loss")
    at = f" (step {int(tr['step'])})" if tr and final is not None and int(tr["step"]) != int(final) else ""
    rows.append(("train loss / acc", f"{_fmt(tr.get('loss'), '.4f')} / {_fmt(as_number(tr.get('accuracy')), '.3f')}{at}"))
    diverged = diverged_step(df)
    if diverged is not None:
        rows.append(("diverged", f"loss not finite from step {diverged} (figures above are the last finite ones)"))
    if len(ev):
        er = last_finite_row(ev, "eval_loss")
        at = f" (step {int(er['step'])})" if er else ""
        rows.append(("eval loss / acc", f"{_fmt(er.get('eval_loss'), '.4f')} / "
                     f"{_fmt(as_number(er.get('eval_accuracy')), '.3f')}{at}"))
        rows.append(("perplexity", _fmt(as_number(er.get("perplexity")), ".2f")))
    per_source = df[df["kind"] == "eval_source"] if len(df) and "source" in df.columns else df.iloc[0:0]
    if per_source["source"].nunique() > 1:  # a mixture: every source's last figures, one row each
        for name, recs in per_source.groupby("source", sort=False):
            r = recs.sort_values("step").iloc[-1]
            rows.append((f"eval {name}", f"loss {_fmt(r['eval_loss'], '.4f')}, "
                                         f"{_fmt(r.get('bits_per_byte'), '.3f')} bits/byte"))
    drawn = (summary.get("training") or {}).get("source_samples")
    if isinstance(drawn, dict) and drawn:
        total = sum(drawn.values()) or 1
        rows.append(("samples drawn", ", ".join(f"{n} {v / total:.1%}" for n, v in drawn.items())))
    tok, step_time = median_value(train, "tokens_per_s"), median_value(train, "step_time_s")
    if tok is not None:
        rows.append(("throughput", f"{tok:,.0f} tokens/s, "
                     + (f"{step_time * 1e3:.1f} ms/step" if step_time is not None else "n/a ms/step")
                     + " (median)"))
    wait = median_value(train, "input_wait_s")
    if wait is not None:
        rows.append(("input wait", f"{wait * 1e3:.1f} ms/step (median)"))
    kind = summary.get("kind") or _str(start.get("device_kind"))
    device = summary.get("device")
    if len(train):
        rows.append(("MFU", mfu_text(median_value(train, "mfu"), kind, device)))
    strategy = summary.get("strategy") or _str(start.get("strategy"))
    replicas = summary.get("replicas") or start.get("replicas")
    batch = summary.get("global_batch") or start.get("global_batch")
    if strategy or device:
        hw = [device or kind or "?", strategy_name(strategy)]
        if replicas:
            hw.append(f"{int(replicas)} replica{'s' if int(replicas) != 1 else ''}")
        if batch:
            hw.append(f"batch {int(batch)}")
        precision = _str(start.get("precision"))
        if precision:
            hw.append(precision)
        rows.append(("hardware", ", ".join(hw)))
    traces = column_values(train, "train_traces").dropna()
    if len(traces):
        rows.append(("step traces", str(int(traces.max()))))
    stages = _stage_seconds(df)
    if stages:
        total = summary.get("seconds")
        text = ", ".join(f"{k} {v:.1f}s" for k, v in stages)
        rows.append(("time", text + (f"; total {total:.1f}s" if isinstance(total, (int, float)) else "")))
    shards = summary.get("shards")
    if isinstance(shards, dict) and shards.get("samples") is not None:
        rows.append(("shards", f"{shards.get('shards', '?')} files, {int(shards['samples']):,} samples, "
                     f"{int(shards.get('tokens') or 0):,} tokens"))
    if summary.get("model_dir"):
        rows.append(("model", str(summary["model_dir"])))
    return rows


def as_number(v: Any) -> float | None:
    """A frame cell as a float (None for a missing one: NaN, pd.NA, None)."""
    return None if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else float(v)


def _str(v: Any) -> str | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _stage_seconds(df: pd.DataFrame) -> list[tuple[str, float]]:
    if df.empty or "event" not in df.columns:
        return []
    ends = df[(df["kind"] == "event") & (df["event"] == "stage_end")]
    return [(str(r["stage"]), float(r["seconds"])) for _, r in ends.iterrows() if pd.notna(r.get("seconds"))]


def render_summary(run_dir: str, df: pd.DataFrame, summary: dict) -> str:
    """The summary as a two-column table of at most WIDTH characters; long values wrap, never cut."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"run {run_dir}", show_header=False, title_justify="left")
    table.add_column("metric", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    rows = summary_rows(df, summary) if not df.empty or summary else []
    if df.empty:
        table.add_row("metrics", "no records yet")
    for k, v in rows:
        table.add_row(k, v)
    console = Console(width=WIDTH, color_system=None, force_terminal=False)
    with console.capture() as cap:
        console.print(table)
    return "\n".join(line.rstrip() for line in cap.get().rstrip("\n").splitlines())
