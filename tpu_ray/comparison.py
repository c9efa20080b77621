"""Runs side by side: one DataFrame of their records (`compare`) and a page of overlaid curves
(`write_comparison`, `tpu-ray compare RUN...`).

Why mark comparability: a loss or perplexity is a figure of its evaluation set, its tokenizer and
its masking rate. Two runs scored on different sets (another tokenizer, other text, another rate)
give numbers that only look comparable: each run gets an evaluation group (A, B, ...) by the
identity of its last evaluation (`eval_set`, which names samples, shard contents, tokenizer, rate
and sequence length), its tokenizer's sha256 and its masking rate, and the page says which differ.
Runs of different groups that scored one same set (a continued run's replayed source is its
parent's whole evaluation set) compare on it: the identity is the set, whoever scored it. A
continued run is drawn at its global step (after its checkpoint's), and only the config keys whose
resolved values differ and change a figure are listed.
Bits per byte stands beside perplexity: it is per byte of text, so it compares runs with different
tokenizers on the same text.
"""

from __future__ import annotations

import html
import os
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

from tpu_ray import storage
from tpu_ray.errors import UserError
from tpu_ray.plots import dots, finish, new_figure, thousands
from tpu_ray.report import _CSS, _check_run_dir, _fmt, _load_summary, load_metrics
from tpu_ray.resume import global_start
from tpu_ray.tables import by_step, column_values, last_value, median_value

if TYPE_CHECKING:
    from tpu_ray.config import CorpusConfig

PLOTS = ("compare_loss.png", "compare_eval_sources.png", "compare_learning_rate.png", "compare_throughput.png")
PAGE = "compare.html"
KINDS = ("train", "eval", "eval_source")
# Keys that differ between any two runs and say nothing about them.
_IGNORED = {"output_dir"}


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# Fields that never change a figure: where things lie, how often to log or save, how to reach the
# cluster, the tracking server. A path (shard.dir, tokenizer.path) is compared by what it holds.
_NO_EFFECT = {
    "output_dir", "name", "ray", "tracking", "shard.dir", "shard.num_actors", "shard.tokenizer_threads",
    "shard.max_unit_retries", "tokenizer.path", "model.preset", "model.init_sha256",
    *(f"train.{k}" for k in ("log_every", "eval_every", "checkpoint_every", "keep_checkpoints",
                             "checkpoint_every_minutes", "strategy", "tpu_name", "peak_flops", "placement",
                             "tpu_topology", "tpu_wait_timeout_s", "num_gpus", "workers_network_closed",
                             "max_failures", "resume_wait_minutes", "steps_per_execution"))}
# Settings "auto" (or None) resolves when training starts: the train_start event's field says what ran.
# (steps_per_execution is not among them: an execution never crosses a log, eval or checkpoint step,
# so it changes no figure, tests/test_tpu_program.py.)
_RESOLVED_AT_START = {"train.mixed_precision": "precision", "train.jit_compile": "jit_compile"}
# Settings that act only when a run resumes: False for a run that never did (one train_start).
_AT_RESUME = ("train.extend_schedule", "train.accept_new_data_order")


def run_config(run: str, metrics: pd.DataFrame | None = None) -> dict[str, Any]:
    """The run's saved config as dotted keys, each at the value the run used (resolved): a preset's
    sizes, the model type's published values, the warm-up and decay in steps; fields that change no
    figure and fields the run does not use (a schedule's unused knobs, a fresh model's initialisation
    for a continued one) left out; the corpus as one value per source. A corpus given in memory
    (written into the run directory) appears as `given:<kind>:<content sha256[:12]>`, so two runs on
    the same data agree. Given the run's `metrics`, mixed precision, steps per execution and XLA are
    what its latest training started with: "auto" and the value it chose are one setting."""
    from tpu_ray.saved_config import read_saved_config

    cfg = read_saved_config(run)
    if cfg is None:
        return {}
    flat = _flat(cfg.model_dump(mode="json", exclude={"corpus"}))
    flat = {k: v for k, v in flat.items() if not any(k == x or k.startswith(x + ".") for x in _NO_EFFECT)}
    m, t = cfg.model, cfg.train
    flat.update({f"model.{k}": v for k, v in m.sizes().items()})
    for key in ("max_position_embeddings", "layer_norm_eps", "initializer_range"):
        flat[f"model.{key}"] = m.published(key)
    if m.init_from:  # the checkpoint's weights: its content, not only its path
        flat["model.init_from"] = f"{m.init_from} (sha256 {str(m.init_sha256)[:12]})" if m.init_sha256 else m.init_from
    if m.init_from or t.branch_from:  # trained weights are loaded over a fresh model's start
        for key in ("model.initializer_range", "model.output_bias"):
            flat.pop(key, None)
    for key, value in _resolved_schedule(t).items():
        if value is None:
            flat.pop(key, None)
        else:
            flat[key] = value
    flat.update(_corpus(run, cfg.corpus))
    if metrics is not None and _starts(metrics) <= 1:
        flat.update(dict.fromkeys(_AT_RESUME, False))  # never resumed: as if unset
    for key, value in _resolved_at_start(metrics).items():
        if value is None:  # no training started: what would have run is unknown, never a difference
            flat.pop(key, None)
        else:
            flat[key] = value
    return flat


def _starts(metrics: pd.DataFrame) -> int:
    """How many times the run's training started (its first start and each resume)."""
    if metrics.empty or "event" not in metrics.columns:
        return 0
    return int(((metrics["kind"] == "event") & (metrics["event"] == "train_start")).sum())


def _resolved_at_start(metrics: pd.DataFrame | None) -> dict[str, Any]:
    """The settings the run's train_start events resolved ("auto" -> what ran), in order: a run
    resumed under other settings shows "mixed_bfloat16 -> float32". A key is None (unknown: never a
    difference) where no training started. On a TPU, XLA is implicit (its train_start records
    jit_compile as null): True."""
    if metrics is None:
        return {}
    if metrics.empty or "event" not in metrics.columns:
        return dict.fromkeys(_RESOLVED_AT_START)
    starts = metrics[(metrics["kind"] == "event") & (metrics["event"] == "train_start")]
    if "time" in starts.columns:
        starts = starts[starts["time"].notna()]  # a damaged time places a start nowhere
    out: dict[str, Any] = dict.fromkeys(_RESOLVED_AT_START)
    for key, field in _RESOLVED_AT_START.items():
        seen = []
        for _, row in starts.iterrows():
            value = row.get(field)
            if key == "train.jit_compile" and row.get("device_kind") == "tpu":
                value = True
            if value is None or (isinstance(value, float) and value != value):  # NaN: the column, not this record
                continue
            value = value.item() if hasattr(value, "item") else value
            value = int(value) if isinstance(value, float) and value.is_integer() else value  # a column with gaps
            if not seen or seen[-1] != value:
                seen.append(value)
        if seen:
            out[key] = seen[0] if len(seen) == 1 else " -> ".join(map(str, seen))
    return out


def _resolved_schedule(t: Any) -> dict[str, Any]:
    """The schedule's fields as the run used them: warm-up and decay in steps; None for a knob its
    schedule does not read (left out of the run's config)."""
    from tpu_ray.train import curves

    wsd = t.schedule == "wsd"
    return {"train.warmup_steps": curves.warmup_steps(t), "train.warmup_ratio": None,
            "train.decay_steps": curves.decay_steps(t) if wsd else None, "train.decay_fraction": None,
            "train.decay_shape": t.decay_shape if wsd else None,
            "train.min_lr_ratio": None if t.schedule == "constant" else t.min_lr_ratio,
            "train.mask_prob_end": t.mask_prob_end if t.mask_schedule == "linear" else None}


def _corpus(run: str, corpus: CorpusConfig) -> dict[str, Any]:
    """`corpus` (one source) or `corpus.sources.NAME`: the source and, after it, the fields it sets
    away from their defaults (weight included), so a mixture is a few lines, not one per field."""
    import json

    from tpu_ray.config import SourceConfig

    defaults = SourceConfig(source="x").model_dump(mode="json")
    given_root = storage.join(run, "corpus") + "/"

    def shown(src: Any) -> str:
        fields = src.model_dump(mode="json")
        where = fields.pop("source")
        if isinstance(where, str) and where.startswith(given_root):
            name = where[len(given_root):].split("/", 1)[0]
            try:
                rec = json.loads(storage.read_text(storage.join(run, "corpus", f"{name}.given.json")))
                where = f"given:{rec.get('kind')}:{str(rec.get('content_sha256'))[:12]}"
            except (OSError, ValueError):
                where = "given:unrecorded"
        extra = [f"{k}={v}" for k, v in fields.items() if k in defaults and v != defaults[k]]
        return ", ".join([str(where), *extra])

    if corpus.sources is None:
        return {"corpus": shown(corpus)}
    out: dict[str, Any] = {f"corpus.sources.{n}": shown(src) for n, src in corpus.sources.items()}
    for key in ("weight_temperature", "weight_schedule"):
        value = getattr(corpus, key)
        out[f"corpus.{key}"] = value if not hasattr(value, "__iter__") else json.dumps(
            [v.model_dump(mode="json") for v in value])
    return out


def differing_keys(configs: Sequence[dict[str, Any]]) -> list[str]:
    """Dotted config keys whose values are not the same in every run that has them (runs without a
    saved config, or a key a run does not use, are left out: unknown or unused is not different);
    a run's corpus is `corpus` or its sources' `corpus.sources.NAME`: one without the other differs."""
    configs = [c for c in configs if c]
    keys = sorted({k for c in configs for k in c})
    out = []
    for k in keys:
        having = [c for c in configs if k in c]
        if k.startswith("corpus.sources.") or k == "corpus":  # a mixture beside a one-source corpus
            having = configs
        if len({repr(c.get(k)) for c in having}) > 1:
            out.append(k)
    return out


def _labels(runs: Sequence[str]) -> list[str]:
    """Short names for the legend: the directory's base name, the whole path where two clash."""
    base = [r.rstrip("/").rsplit("/", 1)[-1] or r for r in runs]
    return [b if base.count(b) == 1 else r for b, r in zip(base, runs)]


def _eval_identity(df: pd.DataFrame, summary: dict) -> tuple[Any, Any, Any]:
    ev = df[df["kind"] == "eval"] if len(df) else df
    last = by_step(ev).iloc[-1] if len(ev) else None
    tok = summary.get("tokenizer") if isinstance(summary.get("tokenizer"), dict) else {}
    eval_set = last.get("eval_set") if last is not None else None
    mask = last.get("eval_mask_prob") if last is not None else None
    return (None if pd.isna(eval_set) else eval_set, tok.get("sha256"),
            None if mask is None or pd.isna(mask) else float(mask))


def eval_groups(identities: Sequence[tuple[Any, Any, Any]]) -> list[str]:
    """A letter per run; runs share a letter only when their evaluations are comparable."""
    letters: dict[tuple, str] = {}
    return [letters.setdefault(i, chr(ord("A") + len(letters))) for i in identities]


def eval_sets(df: pd.DataFrame) -> dict[str, str]:
    """Every evaluation set a run scored, by its identity (train/eval_set.py: the samples' shard
    contents, tokenizer, masking rate and length): "eval" for the pooled set, else the source's name.
    Equal identities are the same tokens under the same masks, whichever run or source scored them."""
    out: dict[str, str] = {}
    if not len(df) or "eval_set" not in df.columns:
        return out
    for kind in ("eval", "eval_source"):  # a one-source run's set is its evaluation's
        recs = df[(df["kind"] == kind) & df["eval_set"].notna()]
        for _, r in recs.iterrows():
            out.setdefault(str(r["eval_set"]), str(r.get("source")) if kind == "eval_source" else "eval")
    return out


def start_step(run: str, df: pd.DataFrame) -> int:
    """The global step a continued run (model.init_from) starts at, so its curves are drawn after
    its parent's, not from 0: resume.global_start (what its own copy of the checkpoint says: an
    export's global step, a run's checkpoint ckpt-N after that run's own start), the one reading
    the trainer stamps into its exports too; for a run with no copy, the checkpoint its init_from
    event names. 0 for a fresh run, a branch (its steps are already the stable run's), or a
    checkpoint of no known step (a published model)."""
    import re

    start = global_start(run)
    if start is not None:
        return start
    named = []
    if len(df) and "event" in df.columns:  # the weights the init_from event names
        named += [str(w) for w in df[(df["kind"] == "event") & (df["event"] == "init_from")].get("weights", [])]
    for text in named:  # the checkpoint's own name only (a path's directories may hold "ckpt-N" too)
        name = text.strip().replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
        if found := re.fullmatch(r"ckpt-(\d+)(?:\.index)?", name):
            return int(found.group(1))
    return 0


def shared_sets(runs: Sequence[str], sets: Sequence[dict[str, str]], groups: Sequence[str]) -> list[dict[str, str]]:
    """The evaluation sets that runs of different groups both scored: {run: its name for the set}
    per set (a continued run's source that is its parent's whole evaluation set, for one)."""
    out = []
    for identity in dict.fromkeys(i for s in sets for i in s):
        having = {run: s[identity] for run, s in zip(runs, sets) if identity in s}
        if len({g for run, g in zip(runs, groups) if run in having}) > 1:
            out.append(having)
    return out


def compare(runs: Sequence[str]) -> pd.DataFrame:
    """The runs' train, eval and eval_source records in one DataFrame: a `run` column (the run
    directory), `eval_group` (same letter: comparable evaluations), `global_step` (a continued run's
    steps after its checkpoint's, see start_step) and one column per config key in which the runs
    differ in a way that changes a figure. `df.attrs`: "differing" lists those keys, "start_step"
    each run's first global step, "shared_sets" the sets runs of different groups both scored."""
    runs = [str(r) for r in runs]
    if not runs:
        raise UserError("compare: name at least one run directory")
    frames, configs, identities, starts, sets = [], [], [], [], []
    for run in runs:
        df = load_metrics(run, missing_ok=False)
        configs.append(run_config(run, df))
        identities.append(_eval_identity(df, _load_summary(run)))
        starts.append(start_step(run, df))
        sets.append(eval_sets(df))
        frames.append(df[df["kind"].isin(KINDS)])
    tokenizers = {i[1] for i in identities}
    if None not in tokenizers and len(tokenizers) == 1:  # one tokenizer: how each run came by it changes nothing
        configs = [{k: v for k, v in c.items() if not k.startswith("tokenizer.")} for c in configs]
    keys = differing_keys(configs)
    groups = eval_groups(identities)
    out = []
    for run, df, cfg, group, start in zip(runs, frames, configs, groups, starts):
        df = df.copy()
        df.insert(0, "run", run)
        df.insert(1, "eval_group", group)
        df["global_step"] = df["step"] + start
        for k in keys:
            df[k] = [cfg.get(k)] * len(df)
        out.append(df)
    result = pd.concat(out, ignore_index=True) if out else pd.DataFrame()
    result.attrs.update(differing=keys, start_step=dict(zip(runs, starts)),
                        shared_sets=shared_sets(runs, sets, groups),
                        shared_identities=[i for i in dict.fromkeys(i for x in sets for i in x)
                                           if len({g for x, g in zip(sets, groups) if i in x}) > 1])
    return result


# ------------------------------------------------------------------------------------------ figures
def final_figures(runs: Sequence[str], df: pd.DataFrame) -> pd.DataFrame:
    """One row per run: its last figures, evaluation group, and the config keys that differ."""
    rows = []
    for run in runs:
        d = df[df["run"] == run]
        train, ev = by_step(d[d["kind"] == "train"]), by_step(d[d["kind"] == "eval"])
        summary = _load_summary(run)
        tok = summary.get("tokenizer") if isinstance(summary.get("tokenizer"), dict) else {}
        steps = pd.concat([column_values(train, "step"), column_values(ev, "step")]).dropna()
        row = {"run": run, "eval_group": d["eval_group"].iloc[0] if len(d) else "A",
               "final step": int(steps.max()) if len(steps) else None,
               "train loss": last_value(train, "loss"), "eval loss": last_value(ev, "eval_loss"),
               "perplexity": last_value(ev, "perplexity"), "bits/byte": last_value(ev, "bits_per_byte"),
               "median tokens/s": median_value(train, "tokens_per_s"),
               "tokenizer": str(tok.get("sha256") or "")[:12] or None,
               "eval set": ev["eval_set"].dropna().iloc[-1] if "eval_set" in ev and ev["eval_set"].notna().any()
               else None,
               "eval mask": last_value(ev, "eval_mask_prob")}
        src = d[d["kind"] == "eval_source"]
        for name, recs in src.groupby("source", sort=True):
            r = recs.sort_values("step").iloc[-1]
            row[f"{name}: ppl / bits/byte"] = f"{_fmt(r.get('perplexity'), '.2f')} / {_fmt(r.get('bits_per_byte'), '.3f')}"
        for k in df.attrs.get("differing", []):
            row[k] = d[k].iloc[0] if len(d) else None
        rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs.update(differing=list(df.attrs.get("differing", [])), shared_sets=list(df.attrs.get("shared_sets", [])))
    return table


def _not_comparable_note(table: pd.DataFrame, labels: Sequence[str] | None = None) -> str:
    if table["eval_group"].nunique() <= 1:
        return "All runs were evaluated on the same set (same tokenizer, text and masking rate): their losses compare."
    name = dict(zip(table["run"], labels if labels is not None else _labels(list(table["run"]))))
    shared = table.attrs.get("shared_sets") or []
    what = [n for col, n in (("tokenizer", "tokenizer"), ("eval set", "evaluation set"),
                             ("eval mask", "masking rate")) if table[col].astype(str).nunique() > 1]
    same = "; ".join(" = ".join(f"{name.get(run, run)}'s {'evaluation' if set_ == 'eval' else repr(set_)}"
                                for run, set_ in having.items()) for having in shared)
    if shared and set().union(*shared) >= set(table["run"]):  # every run scored a set another group scored
        return (f"Comparable on the sets they share: {same} (the same evaluation set: the same text, tokenizer and "
                f"masks); their pooled evaluations differ ({', '.join(what)}): compare loss and perplexity on the "
                f"shared set (the per-source plot), the pooled figures only within a group (the same letter).")
    return (f"NOT COMPARABLE across groups: the runs' evaluations differ ({', '.join(what)}); compare loss and "
            f"perplexity only within a group (the same letter)" + (f", or on a set both scored ({same})" if shared else "")
            + ". Bits per byte compares runs with different tokenizers, on the same text only.")


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def _group_tag(label: str, group: str, many: bool) -> str:
    return f"{label} [eval {group}]" if many else label


def plot_compare(df: pd.DataFrame, runs: Sequence[str], out: dict[str, str]) -> None:
    """The four overlaid plots: loss, per-source evaluation, learning rate, throughput. A continued
    run is drawn at its global step (after its checkpoint's), its legend saying where it starts."""
    starts = df.attrs.get("start_step", {})
    labels = [f"{label} (from step {starts[run]:,})" if starts.get(run) else label
              for run, label in zip(runs, _labels(runs))]
    colors = _colors(len(runs))
    groups = {run: (df[df["run"] == run]["eval_group"].iloc[0] if (df["run"] == run).any() else "A") for run in runs}
    many = len(set(groups.values())) > 1
    parts = {run: df[df["run"] == run] for run in runs}

    fig, ax = new_figure("Masked LM loss (line: train, points: eval)", "step", "cross-entropy loss")
    drew = False
    for run, label, color in zip(runs, labels, colors):
        d = parts[run]
        train, ev = by_step(d[d["kind"] == "train"]), by_step(d[d["kind"] == "eval"])
        if column_values(train, "loss").notna().any():
            ax.plot(train["global_step"], column_values(train, "loss"), color=color, lw=1.2, label=f"{label} train",
                    **dots(column_values(train, "loss")))
            drew = True
        if column_values(ev, "eval_loss").notna().any():
            ax.plot(ev["global_step"], column_values(ev, "eval_loss"), "o--", color=color, ms=6, lw=1,
                    label=_group_tag(f"{label} eval", groups[run], many))
            drew = True
    finish(fig, ax, out["compare_loss.png"], drew, "upper right")

    fig, ax = new_figure("Evaluation loss per source", "step", "cross-entropy loss (masked tokens)")
    drew = False
    shared = list(df.attrs.get("shared_identities", []))
    styles = ["-", "--", ":", "-."]
    for run, label, color in zip(runs, labels, colors):
        d = parts[run]
        src = d[d["kind"] == "eval_source"]
        for i, (name, recs) in enumerate(src.sort_values("step").groupby("source", sort=True)):
            loss = column_values(recs, "eval_loss")
            if not loss.notna().any():
                continue
            bpb = column_values(recs, "bits_per_byte").dropna()
            tag = f" ({bpb.iloc[-1]:.3f} bits/byte)" if len(bpb) else ""
            ax.plot(recs["global_step"], loss, marker="o", ls=styles[i % 4], color=color, ms=4, lw=1.3,
                    label=f"{label}: {name}{tag} {_set_tag(recs, shared, groups[run], many)}".rstrip())
            drew = True
    finish(fig, ax, out["compare_eval_sources.png"], drew, "upper right")

    fig, ax = new_figure("Learning rate schedule", "step", "learning rate")
    drew = _overlay_train(ax, "learning_rate", runs, labels, colors, parts)
    if drew:
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        ax.set_ylim(bottom=0)
    finish(fig, ax, out["compare_learning_rate.png"], drew, "upper right")

    fig, ax = new_figure("Throughput", "step", "tokens / s")
    drew = _overlay_train(ax, "tokens_per_s", runs, labels, colors, parts)
    if drew:
        ax.yaxis.set_major_formatter(thousands())
        top = column_values(df[df["kind"] == "train"], "tokens_per_s").max()
        ax.set_ylim(0, top * 1.15)  # headroom above the curves
    finish(fig, ax, out["compare_throughput.png"], drew, "lower right")


def _set_tag(recs: pd.DataFrame, shared: Sequence[str], group: str, many: bool) -> str:
    """A source's legend tag: "[shared set N]" when runs of different groups scored that very set
    (its losses compare across them), else the run's evaluation group."""
    ids = recs["eval_set"].dropna() if "eval_set" in recs.columns else pd.Series(dtype=object)
    if len(ids) and str(ids.iloc[-1]) in shared:
        return f"[shared set {shared.index(str(ids.iloc[-1])) + 1}]"
    return f"[eval {group}]" if many else ""


def _overlay_train(ax, column: str, runs, labels, colors, parts) -> bool:
    """One line per run of a train-record column (learning rate, throughput); whether any was drawn."""
    drew = False
    for run, label, color in zip(runs, labels, colors):
        train = by_step(parts[run][parts[run]["kind"] == "train"])
        values = column_values(train, column)
        if values.notna().any():
            ax.plot(train["global_step"], values, color=color, lw=1.2, label=label, **dots(values))
            drew = True
    return drew


def _frame_table(table: pd.DataFrame, labels: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    body = []
    for label, (_, row) in zip(labels, table.iterrows()):
        cells = []
        for c in table.columns:
            v = label if c == "run" else row[c]
            spec = {"train loss": ".4f", "eval loss": ".4f", "perplexity": ".2f", "bits/byte": ".3f",
                    "median tokens/s": ",.0f", "eval mask": ".2f"}.get(c, "")
            cells.append(f"<td>{html.escape(_fmt(None if _missing(v) else v, spec))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div style="overflow-x:auto"><table>\n<tr>{head}</tr>\n' + "\n".join(body)
            + "\n</table></div>")


def _missing(v: Any) -> bool:
    try:
        return v is None or bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _page(runs: Sequence[str], table: pd.DataFrame, keys: Sequence[str]) -> str:
    labels = _labels(runs)
    note = _not_comparable_note(table)
    cls = "bad" if table["eval_group"].nunique() > 1 else "ok"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>tpu-ray comparison of {len(runs)} runs</title><style>{_CSS}"
             ".bad{background:#fde8e8;border:1px solid #e0a0a0;padding:0.6em}"
             ".ok{background:#eaf6ea;border:1px solid #a0d0a0;padding:0.6em}</style></head><body>",
             "<h1>tpu-ray run comparison</h1><ul>"
             + "".join(f"<li><b>{html.escape(lbl)}</b>: <code>{html.escape(r)}</code></li>"
                       for lbl, r in zip(labels, runs)) + "</ul>",
             f'<p class="{cls}" id="comparability">{html.escape(note)}</p>',
             "<h2>Final figures</h2>", _frame_table(table, labels),
             "<h2>Config keys that differ</h2>",
             "<p>" + (html.escape(", ".join(keys)) if keys else "none: the runs share one config") + "</p>",
             "<h2>Plots</h2>"]
    parts += [f'<div><img src="{name}" alt="{name[8:-4].replace("_", " ")}"></div>' for name in PLOTS]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_comparison(runs: Sequence[str], out_dir: str) -> dict[str, str]:
    """compare.html and its PNGs in `out_dir` (local or gs://); returns {file name: path}."""
    runs = [str(r) for r in runs]
    for run in runs:
        if not _check_run_dir(run):
            raise UserError(f"run directory not found: {run}")
    df = compare(runs)
    table = final_figures(runs, df)
    if not storage.is_remote(out_dir) and os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"{out_dir}: --out is an existing file, not a directory; pass a directory")
    # Rendered into a temp directory, then each file committed by rename (as report.py does): a
    # link planted in --out in place of a plot or the page is replaced, never written through.
    with tempfile.TemporaryDirectory(prefix="tpu-ray-compare-") as local:
        paths = {name: os.path.join(local, name) for name in (*PLOTS, PAGE)}
        plot_compare(df, runs, paths)
        with open(paths[PAGE], "w", encoding="utf-8") as f:
            f.write(_page(runs, table, df.attrs["differing"]))
        storage.makedirs(out_dir)
        out = {}
        for name, path in paths.items():
            out[name] = storage.join(out_dir, name)
            storage.atomic_copy_file(path, out[name])
        return out


def comparison_text(runs: Sequence[str], table: pd.DataFrame | None = None) -> str:
    """The final-figures table as text (what `tpu-ray compare` prints), with the comparability note."""
    runs = [str(r) for r in runs]
    if table is None:
        table = final_figures(runs, compare(runs))
    shown = table.copy()
    shown["run"] = _labels(runs)
    cols = [c for c in ("run", "eval_group", "final step", "train loss", "eval loss", "perplexity", "bits/byte",
                        "median tokens/s") if c in shown.columns]
    specs = {"train loss": ".4f", "eval loss": ".4f", "perplexity": ".2f", "bits/byte": ".3f",
             "median tokens/s": ",.0f"}
    lines = []
    widths = {c: max(len(c), *(len(_fmt(None if _missing(v) else v, specs.get(c, ""))) for v in shown[c]))
              for c in cols}
    lines.append("  ".join(c.rjust(widths[c]) if c != "run" else c.ljust(widths[c]) for c in cols))
    for _, row in shown.iterrows():
        lines.append("  ".join((_fmt(None if _missing(row[c]) else row[c], specs.get(c, ""))).rjust(widths[c])
                               if c != "run" else str(row[c]).ljust(widths[c]) for c in cols))
    for k in table.attrs.get("differing", []):
        lines.append(f"{k}: " + ", ".join(f"{lbl}={_fmt(v)}" for lbl, v in zip(shown['run'], table[k])))
    lines.append(_not_comparable_note(table))
    from tpu_ray.downstream.history import comparison_lines

    return "\n".join(lines + comparison_lines([load_metrics(run) for run in runs], list(shown["run"])))
