"""Read a run's metrics stream and turn it into plots, an HTML report and a text summary.

The run directory is the only channel between a training job and the people watching it:
`<run_dir>/metrics.jsonl` (appended while the run goes on), `summary.json` (at the end) and
`config.yaml`. Everything here reads and writes those files through tpu_ray.storage, so `run_dir` may be a local path or a
`gs://` URI, and works on a live run (the last line may be half written: it is skipped).
"""

from __future__ import annotations

import html
import json
import logging
import math
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import pandas as pd

from tpu_ray import storage
from tpu_ray.errors import UserError
from tpu_ray.metrics_stream import (  # noqa: F401 (the reading API, also imported from here)
    BASE_COLUMNS, KIND_COLUMNS, TEXT_COLUMNS, _check_run_dir, _read_metrics, _read_text, load_metrics, read_records)
from tpu_ray.redact import redact
from tpu_ray.rundir import CONFIG_FILE, SHARDS_DIR, SUMMARY_FILE
from tpu_ray.plots import plot_accuracy, plot_downstream, plot_eval_sources, plot_loss, plot_lr, plot_throughput
from tpu_ray.tables import as_number, by_step, column_values, diverged_step, last_finite_row, median_value, mfu_text

log = logging.getLogger("tpu_ray.report")

PLOTS = ("loss.png", "eval_sources.png", "throughput.png", "learning_rate.png", "accuracy.png")
DOWNSTREAM_PLOT = "downstream.png"  # only for a run with downstream scores (eval.downstream, tpu-ray finetune)
REPORT_FILE = "report.html"

# ----------------------------------------------------------------------------------------- reading

def _load_summary(run_dir: str) -> dict:
    text = _read_text(storage.join(run_dir, SUMMARY_FILE))
    if not text:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        log.warning("%s is not valid JSON (still being written?): ignored", storage.join(run_dir, SUMMARY_FILE))
        return {}
    return data if isinstance(data, dict) else {"summary": data}


# ------------------------------------------------------------------------------------------- numbers

def _fmt(v: Any, spec: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    if spec and isinstance(v, (int, float)):
        return format(v, spec)
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _stats(df: pd.DataFrame, summary: dict) -> list[tuple[str, str]]:
    """(label, formatted value) rows shared by the HTML report and the text summary."""
    train = by_step(df[df["kind"] == "train"]) if len(df) else df
    ev = by_step(df[df["kind"] == "eval"]) if len(df) else df
    steps = pd.concat([column_values(train, "step"), column_values(ev, "step")]).dropna()
    final_step = int(steps.max()) if len(steps) else None
    step_time = median_value(train, "step_time_s")
    mfu = median_value(train, "mfu")
    tr, er = last_finite_row(train, "loss"), last_finite_row(ev, "eval_loss")  # each figure with its own step
    diverged = diverged_step(df)
    traces = column_values(train, "train_traces").dropna()
    wait = median_value(train, "input_wait_s")
    return [
        ("final step", _fmt(final_step)),
        *([("diverged", f"loss not finite from step {diverged}; the losses below are the last finite ones")]
          if diverged is not None else []),
        ("final train loss" + (f" (step {int(tr['step'])})" if tr else ""), _fmt(tr.get("loss"), ".4f")),
        ("final train accuracy", _fmt(as_number(tr.get("accuracy")), ".4f")),
        ("eval loss" + (f" (step {int(er['step'])})" if er else ""), _fmt(er.get("eval_loss"), ".4f")),
        ("eval accuracy", _fmt(as_number(er.get("eval_accuracy")), ".4f")),
        ("perplexity", _fmt(as_number(er.get("perplexity")), ".2f")),
        ("median tokens/s", _fmt(median_value(train, "tokens_per_s"), ",.0f")),
        ("median samples/s", _fmt(median_value(train, "samples_per_s"), ",.1f")),
        ("median step time", _fmt(step_time * 1e3, ".1f") + " ms" if step_time is not None else "n/a"),
        ("median input wait", _fmt(wait * 1e3, ".1f") + " ms" if wait is not None else "n/a"),
        ("median MFU", mfu_text(mfu, summary.get("kind"), summary.get("device"))),
        ("train traces", _fmt(int(traces.max()) if len(traces) else None)),
        ("train records / eval records", f"{len(train)} / {len(ev)}"),
    ]


def _shard_rows(run_dir: str) -> list[tuple[str, str]]:
    """The run's shard set as the manifest describes it (the saved config's shard.dir, else
    RUN/shards of the directory reported, which may be a copy); [] when there is none. A damaged
    manifest or config is shown, not raised: the report of a run must still render."""
    from tpu_ray.prepare.shard_set import ShardSet
    from tpu_ray.saved_config import read_saved_config

    try:
        cfg = read_saved_config(run_dir)
        shards = ShardSet.open(cfg.shard.dir if cfg and cfg.shard.dir else storage.join(run_dir, SHARDS_DIR))
    except (UserError, OSError, ValueError) as exc:
        return [("shards", f"cannot be read: {exc}")]
    return shards.describe() if shards.entries else []


def _recipe_rows(run_dir: str, df: pd.DataFrame) -> list[tuple[str, str]]:
    """The recipe the saved config names, and what the output-bias event counted (every lever a
    run trained with belongs in its report). A damaged config is shown, not raised."""
    from tpu_ray.saved_config import read_saved_config
    from tpu_ray.train.recipe import recipe_text

    try:
        cfg = read_saved_config(run_dir)
    except (UserError, OSError, ValueError) as exc:
        return [("recipe", f"cannot be read: {exc}")]
    rows = [("recipe", recipe_text(cfg.train, cfg.model))] if cfg else []
    events = df[(df["kind"] == "event") & (df["event"] == "output_bias")] if "event" in df.columns else df.iloc[0:0]
    for _, e in events.iterrows():
        rows.append(("output bias", f"{e.get('init')}: log frequencies of {int(e['tokens_counted']):,} training "
                                    f"tokens; a frequency-only loss of {_fmt(e.get('frequency_loss'), '.4f')} nats"))
    return rows


def _stage_rows(df: pd.DataFrame) -> list[tuple[str, str]]:
    if df.empty or "event" not in df.columns:
        return []
    ends = df[(df["kind"] == "event") & (df["event"] == "stage_end")]
    rows = []
    for _, r in ends.iterrows():
        secs = r.get("seconds")
        rows.append((str(r.get("stage")), _fmt(float(secs), ".1f") + " s" if pd.notna(secs) else "n/a"))
    return rows


# --------------------------------------------------------------------------------------------- plots

def _table(rows: list[tuple[str, str]]) -> str:
    body = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>\n{body}\n</table>"


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin-bottom:1.5em}th,td{border:1px solid #ccc;padding:4px 10px}
th{text-align:left;background:#f4f4f4;font-weight:600}td{font-family:monospace}
img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}
pre{background:#f7f7f7;padding:1em;border:1px solid #ddd;overflow-x:auto}"""


def _source_rows(df: pd.DataFrame) -> list[tuple[str, str]]:
    """Each source's last evaluation: loss, accuracy, perplexity, bits per byte and its set."""
    rows = []
    ev = df[df["kind"] == "eval_source"] if len(df) and "source" in df.columns else df.iloc[0:0]
    for name, recs in ev.groupby("source", sort=False):
        r = recs.sort_values("step").iloc[-1]
        rows.append((str(name), f"step {int(r['step'])}: loss {_fmt(r.get('eval_loss'), '.4f')}, accuracy "
                                f"{_fmt(r.get('eval_accuracy'), '.3f')}, perplexity {_fmt(r.get('perplexity'), '.2f')}, "
                                f"{_fmt(r.get('bits_per_byte'), '.3f')} bits/byte (set {r.get('eval_set')})"))
    return rows


def _downstream_rows(table: pd.DataFrame) -> list[tuple[str, str]]:
    """Each task's best-learning-rate score per checkpoint step (`table`: downstream.history.best's),
    as the text summary's lines say it, as rows."""
    from tpu_ray.downstream.history import score_text

    return [(f"{r['task']}" + ("" if pd.isna(r["step"]) else f" @ step {int(r['step'])}")
             + (f" (model {r['shown_model']})" if r.get("shown_model") else ""), score_text(r))
            for _, r in table.sort_values(["task", "step"], na_position="first").iterrows()]


def _html(run_dir: str, stats, stages, summary: dict, config_text: str | None,
          shards: Sequence[tuple[str, str]] = (), sources: Sequence[tuple[str, str]] = (),
          downstream: Sequence[tuple[str, str]] = ()) -> str:
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>tpu-ray report: {html.escape(run_dir)}</title><style>{_CSS}</style></head><body>",
        f"<h1>tpu-ray run report</h1><p><code>{html.escape(run_dir)}</code></p>",
        "<h2>Summary</h2>", _table(stats),
    ]
    if summary:
        parts += ["<h2>summary.json</h2>", _table([(str(k), _fmt(v)) for k, v in summary.items()])]
    if stages:
        parts += ["<h2>Stages</h2>", _table(stages)]
    if shards:
        parts += ["<h2>Shards</h2>", _table(list(shards))]
    if sources:
        parts += ["<h2>Evaluation per source</h2>", _table(list(sources))]
    if downstream:
        parts += ["<h2>Downstream (fine-tuned; one learning rate per task, chosen on validation)</h2>", _table(list(downstream))]
    parts.append("<h2>Plots</h2>")
    for name in (*PLOTS, *([DOWNSTREAM_PLOT] if downstream else [])):
        parts.append(f'<div><img src="{name}" alt="{name[:-4].replace("_", " ")}"></div>')
    parts.append("<h2>config.yaml</h2>")
    parts.append(f"<pre>{html.escape(config_text)}</pre>" if config_text is not None
                 else "<p>(no config.yaml in the run directory)</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(run_dir: str, out_dir: str | None = None) -> dict[str, str]:
    """Write loss.png, eval_sources.png, throughput.png, learning_rate.png, accuracy.png and report.html,
    and downstream.png for a run with downstream scores.

    `out_dir` defaults to `run_dir`. A remote (gs://) destination is rendered into a local temp
    directory and uploaded. Returns {file name: path written}.
    """
    df = load_metrics(run_dir, missing_ok=False)
    summary = _load_summary(run_dir)
    config_text = _read_text(storage.join(run_dir, CONFIG_FILE))
    train = by_step(df[df["kind"] == "train"]) if len(df) else df
    ev = by_step(df[df["kind"] == "eval"]) if len(df) else df

    out_dir = out_dir or run_dir
    if not storage.is_remote(out_dir) and os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"{out_dir}: --out is an existing file, not a directory; pass a directory")
    # Rendered into a temp directory, then each file committed by rename: a link planted in place
    # of report.html or a plot is replaced, never followed (it could point at any file of ours).
    with tempfile.TemporaryDirectory(prefix="tpu-ray-report-") as local:
        from tpu_ray.downstream.history import best

        scores = best(df)  # each task's best learning rate per step: the table's rows and the plot's points
        downstream = _downstream_rows(scores)
        names = (*PLOTS, *([DOWNSTREAM_PLOT] if downstream else []), REPORT_FILE)
        lp = {name: os.path.join(local, name) for name in names}
        plot_loss(train, ev, lp["loss.png"])
        plot_eval_sources(df[df["kind"] == "eval_source"] if len(df) else df, lp["eval_sources.png"])
        plot_throughput(train, lp["throughput.png"])
        plot_lr(train, lp["learning_rate.png"])
        plot_accuracy(train, ev, lp["accuracy.png"])
        if downstream:
            plot_downstream(scores, lp[DOWNSTREAM_PLOT])
        stats = [*_stats(df, summary), *_recipe_rows(run_dir, df)]
        page = redact(_html(run_dir, stats, _stage_rows(df), summary, config_text, _shard_rows(run_dir),
                            _source_rows(df), downstream))
        with open(lp[REPORT_FILE], "w", encoding="utf-8") as f:
            f.write(page)
        storage.makedirs(out_dir)
        out = {}
        for name, path in lp.items():
            out[name] = storage.join(out_dir, name)
            storage.atomic_copy_file(path, out[name])
        return out


def text_summary(run_dir: str) -> str:
    """The end-of-run summary: one screen, 80 columns, each number once (see tpu_ray.tables)."""
    from tpu_ray.tables import render_summary

    from tpu_ray.downstream.history import summary_lines

    df = load_metrics(run_dir, missing_ok=False)
    return "\n".join([render_summary(run_dir, df, _load_summary(run_dir)), *summary_lines(df)])
