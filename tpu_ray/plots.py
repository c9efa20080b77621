"""The report's plots (loss, evaluation loss per source, throughput and MFU, learning rate, accuracy,
downstream scores) as PNG files, drawn with matplotlib's object API (no pyplot state, so plotting is safe in threads and notebooks)."""

from __future__ import annotations


import pandas as pd

from tpu_ray.tables import column_values


def new_figure(title: str, xlabel: str, ylabel: str):
    # A bare Figure renders with Agg and never touches pyplot's global state or a display.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def dots(series: pd.Series) -> dict:
    """Markers on sparse lines: the reader must see which steps were logged (a line joining three
    records would otherwise pass for a measured curve, e.g. hide the warmup of the LR schedule)."""
    return {"marker": "o", "ms": 3} if series.notna().sum() <= 60 else {}


def from_step_zero(ax) -> None:
    """A run starts at step 0: show how far into it the first record is."""
    ax.set_xlim(left=0)


def no_data(ax) -> None:
    ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes, color="gray")


def finish(fig, ax, path: str, drew: bool, legend: str) -> None:
    """Legend and x from step 0 when something was drawn, else "no data yet"; then the PNG."""
    if drew:
        ax.legend(loc=legend)
        from_step_zero(ax)
    else:
        no_data(ax)
    fig.savefig(path)


def plot_train_and_eval(train: pd.DataFrame, ev: pd.DataFrame, path: str, title: str, ylabel: str,
                        train_col: str, eval_col: str, what: str, legend: str) -> None:
    """One quantity as a thin train line and bold eval points (loss, accuracy)."""
    fig, ax = new_figure(title, "step", ylabel)
    drew = False
    if column_values(train, train_col).notna().any():
        ax.plot(train["step"], column_values(train, train_col), label=f"train {what}", color="tab:blue", lw=1.2,
                **dots(column_values(train, train_col)))
        drew = True
    if column_values(ev, eval_col).notna().any():
        ax.plot(ev["step"], column_values(ev, eval_col), "o-", label=f"eval {what}", color="tab:orange", lw=1.5, ms=6)
        drew = True
    finish(fig, ax, path, drew, legend)


def plot_loss(train: pd.DataFrame, ev: pd.DataFrame, path: str) -> None:
    plot_train_and_eval(train, ev, path, "Masked LM loss", "cross-entropy loss", "loss", "eval_loss", "loss",
                        "upper right")


def plot_throughput(train: pd.DataFrame, path: str):
    """Returns the figure (tests check where its legend went)."""
    fig, ax = new_figure("Throughput", "step", "tokens / s")
    tok = column_values(train, "tokens_per_s")
    mfu = column_values(train, "mfu")
    handles = []
    if tok.notna().any():
        handles += ax.plot(train["step"], tok, label="tokens/s", color="tab:green", lw=1.2, **dots(tok))
        ax.yaxis.set_major_formatter(thousands())
        ax.set_ylim(0, tok.max() * 1.15)  # headroom above the curve
        ax.set_ylabel("tokens / s", color="tab:green")
    if mfu.notna().any():
        ax2 = ax.twinx()
        handles += ax2.plot(train["step"], mfu * 100, label="MFU", color="tab:purple", lw=1.2, ls="--",
                            **dots(mfu))
        ax2.set_ylabel("MFU (%)", color="tab:purple")
        # MFU is proportional to tokens/s: on a matching scale the two lines would coincide. A 0-100%
        # axis keeps them apart and shows the distance from peak at a glance.
        # Above 100% (a CPU peak measured under load) the axis must not scale like tokens/s's own
        # (x1.15), or the MFU line lies exactly on the tokens/s line and hides it.
        top = mfu.max() * 100
        ax2.set_ylim(0, 100.0 if top <= 100 / 1.15 else max(100.0, top * 1.6))
    elif handles:
        ax.set_title("Throughput (MFU not available)")
    if handles:
        # Outside the axes, under the plot: inside, it covers the MFU line wherever that runs (a CPU
        # run's MFU of a few % runs along the bottom, a TPU's 30-60% across the middle).
        fig.legend(handles=handles, labels=[h.get_label() for h in handles], loc="outside lower center",
                   ncols=len(handles), frameon=False)
        from_step_zero(ax)
    else:
        no_data(ax)
    fig.savefig(path)
    return fig


def thousands():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: f"{v:,.0f}")


def plot_lr(train: pd.DataFrame, path: str) -> None:
    fig, ax = new_figure("Learning rate schedule", "step", "learning rate")
    lr = column_values(train, "learning_rate")
    if lr.notna().any():
        ax.plot(train["step"], lr, label="learning rate (at logged steps)", color="tab:red", lw=1.2,
                **dots(lr))
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        ax.set_ylim(bottom=0)
    finish(fig, ax, path, lr.notna().any(), "upper right")


def plot_accuracy(train: pd.DataFrame, ev: pd.DataFrame, path: str) -> None:
    plot_train_and_eval(train, ev, path, "Masked-token accuracy", "accuracy", "accuracy", "eval_accuracy", "accuracy",
                        "lower right")



def plot_eval_sources(ev_sources: pd.DataFrame, path: str) -> None:
    """Each source's evaluation loss as its own curve (a mixture: the domain, the replayed general
    text, the evaluation-only sets), with bits per byte in the legend where it was measured."""
    fig, ax = new_figure("Evaluation loss per source", "step", "cross-entropy loss (masked tokens)")
    drew = False
    if len(ev_sources) and "source" in ev_sources.columns:
        for name, rows in ev_sources.sort_values("step").groupby("source", sort=False):
            loss = column_values(rows, "eval_loss")
            if not loss.notna().any():
                continue
            bpb = column_values(rows, "bits_per_byte").dropna()
            label = f"{name}" + (f" ({bpb.iloc[-1]:.3f} bits/byte at the end)" if len(bpb) else "")
            ax.plot(rows["step"], loss, "o-", label=label, lw=1.5, ms=5)
            drew = True
    finish(fig, ax, path, drew, "upper right")


def plot_downstream(best: pd.DataFrame, path: str) -> None:
    """Each fine-tuning task's score against the checkpoint step it fine-tuned (eval.downstream from
    step 0, or `tpu-ray finetune` of a run's checkpoints): the mean over seeds on the reported split
    (test where the task has one) at the curve's learning rate, its sd as an error bar, and the
    task's chance (the best constant answer) as a dashed line of the same colour. `best`:
    tpu_ray.downstream.history.best's table. A score without a step (a model outside a run) is drawn
    at step 0."""
    fig, ax = new_figure("Downstream: fine-tuned score per checkpoint", "checkpoint step",
                         "score (the task's headline metric)")
    drew = False
    keys = ["task_hash", "settings_key", *(["lineage", "shown_model"] if "lineage" in best.columns else [])]
    for (task_hash, _, *lineage), rows in best.groupby(keys, sort=True, dropna=False):
        task = str(rows["task"].iloc[-1]).replace("$", r"\$")  # a $ would start matplotlib's mathtext
        rows = rows.assign(step=rows["step"].fillna(0)).sort_values("step")
        metric, split = rows["metric"].iloc[-1], rows["split"].iloc[-1]
        model = f", model {lineage[1]}" if lineage and lineage[1] else ""  # several models: named
        label = f"{task} ({split} {metric}, lr {rows['learning_rate'].iloc[-1]:g}, data {str(task_hash)[:8]}{model})"
        line = ax.errorbar(rows["step"], rows["mean"], yerr=rows["sd"], fmt="o-", capsize=3, lw=1.5, ms=5, label=label)
        chance = pd.to_numeric(rows["chance"], errors="coerce").dropna()
        if len(chance):
            ax.axhline(chance.iloc[-1], ls="--", lw=1, color=line[0].get_color(), label=f"{task}: chance")
        drew = True
    if drew:  # room left of step 0 (not finish's x from 0), so its error bar's caps are whole
        ax.legend(loc="best")
        right = max(float(best["step"].fillna(0).max()), 1.0)
        ax.set_xlim(left=-0.04 * right, right=right * 1.04)
        low, high = ax.get_ylim()  # the chance lines and every error bar inside, with a margin
        ax.set_ylim(low - 0.05 * (high - low), high + 0.05 * (high - low))
    else:
        no_data(ax)
    fig.savefig(path)
