"""Time to quality of the schedules (issue 32), against the reference `model.fit` recipe, in one run.

On benchmarks/learning.py's setting (WikiText-2, hidden 128, 2 layers, 1,500 steps, lr 2e-3,
warm-up 100, 30% masked with an exact count: what jobs/configs ship; each row sets its schedule and
output bias), one tokenizer and one set of
shards (cut at the full length and, from the same tokenization, at half of it for the phases row),
the reference `model.fit` trains once, then tpu-ray trains one run per recipe:

- linear: today's recipe (warm-up, linear decay to zero), the row the others are compared with;
- wsd: the peak held, the last 20% a 1-sqrt decay (ModernBERT's trapezoid);
- cosine;
- phases: the first 85% of the steps at half the sequence length, the last 15% at the full one;
- phases + wsd: both;
- falling masking rate: 30% linearly to 15% (train.mask_schedule=linear);
- linear + bias, wsd + bias: the head's output bias started at the training tokens' log
  frequencies (model.output_bias=unigram, issue 49); wsd + bias is what jobs/configs/quickstart.yaml
  ships and learning.py's default.

Every run's checkpoints (every `--snapshot-every` steps) are scored on the held-out test text after
training (learning.py's evaluation, 15% masked), each stamped with its commit time since the run
started. Per row: the final test loss, the steps and seconds at which the run first reaches the
reference's final test loss (linear between snapshots), and those seconds as a ratio of the
reference's (its last snapshot's stamp: learning.py's `time_to_reference_ratio`).

`--branches`: one `constant` run (the stable run of a wsd recipe) keeps its checkpoints; from each
of `--branch-at` a short 1-sqrt decay (`--decay-fraction` of the branch step, at least 50 steps) is
branched with `train.branch_from`; each branch's final test loss is a point of a loss-against-steps
curve that one training run gave. Written to `--branch-plot` (PNG) beside the wsd and linear runs'
curves when they ran.

    python benchmarks/schedules.py --work runs/sched            # the table (~45 min on 2 idle cores)
    python benchmarks/schedules.py --work runs/sched --branches --only none
    python benchmarks/schedules.py --only wsd,phases+wsd --reference-curve LAST_LINE.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def recipes(steps: int, seq_len: int) -> dict[str, dict]:
    """Each row's overrides of tpu-ray's side (learning.py's settings otherwise)."""
    short = round(steps * 0.85)
    phases = [{"steps": short, "seq_len": seq_len // 2}, {"steps": steps - short, "seq_len": seq_len}]
    # Every row names its schedule and output bias: learning.py's defaults are the shipped recipe's.
    zeros = {"model.output_bias": "zeros", "model.initializer_range": None}  # transformers' own start
    bias = {"model.output_bias": "unigram"}
    linear = {"train.schedule": "linear", **zeros}
    wsd = {"train.schedule": "wsd", "train.decay_fraction": 0.2, "train.decay_shape": "1-sqrt", **zeros}
    return {
        "linear": linear,
        "wsd": wsd,
        "cosine": {"train.schedule": "cosine", **zeros},
        "phases": {"train.phases": phases, **linear},
        "phases+wsd": {"train.phases": phases, **wsd},
        "mask 30%->15%": {"train.mask_schedule": "linear", "train.mask_prob_end": 0.15, **linear},
        "linear + bias": {**linear, **bias},
        "wsd + bias": {**wsd, **bias},
        "wsd + bias + init 0.04": {**wsd, **bias, "model.initializer_range": 0.04},  # what quickstart.yaml ships
    }


def score_run(cfg, batch) -> tuple[float, float, list]:
    """Train `cfg`; (final test loss, training seconds, [(seconds, step, test loss)] per checkpoint)."""
    import learning

    (loss, _), seconds, _, curve = learning.run_tpu_ray(cfg, Path(cfg.run_dir), batch)
    return loss, seconds, curve


def branch_curve(cfg, batch, work: Path, branch_at: list[int], fraction: float) -> list[tuple[int, int, float, float]]:
    """The stable (constant) run, then a decay branched from each of `branch_at`:
    [(branch step, end step, stable loss at the branch, branched loss at its end)]."""
    import learning
    from tpu_ray.pipeline import Pipeline

    cfg = cfg.override({"train.placement": "local"})
    # The stable run goes as far as the last branch: a constant rate does not depend on train.steps.
    stable = cfg.override({"output_dir": str(work / "run-stable"), "train.schedule": "constant",
                           "train.steps": max(branch_at)})
    if not (Path(stable.run_dir) / "model").exists():
        Pipeline(stable).train()  # through the pipeline: config.yaml, which a branch is checked against
    from transformers import TFAutoModelForMaskedLM
    import tensorflow as tf

    model = TFAutoModelForMaskedLM.from_pretrained(str(Path(stable.run_dir) / "model"), use_safetensors=False)
    out = []
    for at in branch_at:
        decay = max(50, round(at * fraction))
        tf.train.Checkpoint(model=model).restore(str(Path(stable.run_dir) / "checkpoints" / f"ckpt-{at}")).expect_partial()
        before = learning.evaluate(model, batch)[0]
        branch = cfg.override({"output_dir": str(work / f"run-branch-{at}"), "train.schedule": "wsd",
                               "train.steps": at + decay, "train.decay_steps": decay, "train.decay_shape": "1-sqrt",
                               "train.branch_from": str(Path(stable.run_dir) / "checkpoints" / f"ckpt-{at}"),
                               "train.checkpoint_every": decay})
        t = time.perf_counter()
        summary = Pipeline(branch).train()
        took = time.perf_counter() - t
        after = learning.evaluate(TFAutoModelForMaskedLM.from_pretrained(summary["model_dir"], use_safetensors=False),
                                  batch)[0]
        out.append((at, at + decay, round(before, 4), round(after, 4)))
        print(f"  branch at {at}: stable loss {before:.3f}; a {decay}-step 1-sqrt decay ({took:.0f} s) ends at "
              f"step {at + decay} with {after:.3f}", flush=True)
    return out


def plot_branches(path: str, points: list, curves: dict[str, list], target: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, curve in curves.items():
        if curve:
            ax.plot([c[1] for c in curve], [c[2] for c in curve], lw=1, alpha=0.7, label=label)
    ax.plot([p[0] for p in points], [p[2] for p in points], "o", color="grey", ms=4, label="stable run (constant) at the branch")
    ax.plot([p[1] for p in points], [p[3] for p in points], "s-", color="C3", ms=5,
            label="a 1-sqrt decay branched off it")
    for p in points:
        ax.annotate("", xy=(p[1], p[3]), xytext=(p[0], p[2]), arrowprops={"arrowstyle": "->", "color": "C3", "lw": 0.8})
    if target is not None:
        ax.axhline(target, color="grey", ls="--", lw=0.8, label="reference final loss")
    ax.set_xlabel("optimizer steps")
    ax.set_ylabel("WikiText-2 test loss (masked tokens, nats)")
    ax.set_title("One stable run, a finished model at every budget (branched decays)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", required=True, help="tokenizer, shards and one run directory per row")
    p.add_argument("--only", help="comma-separated rows (default: all; 'none' for --branches alone)")
    p.add_argument("--reference-curve", help="a JSON line of an earlier run (learning.py's or this one's): reuse its "
                   "reference side instead of training model.fit again")
    p.add_argument("--branches", action="store_true", help="also the branched-decay curve off one stable run")
    p.add_argument("--branch-at", type=lambda v: [int(x) for x in v.split(",")], default=[300, 600, 900, 1200])
    p.add_argument("--decay-fraction", type=float, default=0.2, help="each branch's decay, as a share of its step")
    p.add_argument("--branch-plot", default=str(REPO / "docs" / "images" / "wsd-branches.png"))
    ours, rest = p.parse_known_args()
    import learning

    args = learning.parser().parse_args(rest)  # learning.py's setting and its options (--steps, ...)
    args.work = ours.work
    logging.basicConfig(level=logging.WARNING)

    work = Path(ours.work)
    work.mkdir(parents=True, exist_ok=True)
    cfg = learning.prepare(work, args, extra_lengths=(args.seq_len // 2,))
    cfg = cfg.override({"train.checkpoint_every": args.snapshot_every})
    batch = learning.test_batch(cfg)
    print(f"WikiText-2 valid -> train, test held out; hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, "
          f"seq_len {args.seq_len}, batch {args.batch}, {args.steps} steps, lr {args.lr}, warm-up {args.warmup}, "
          f"{args.mask_prob:.0%} masked ({args.mask_count})", flush=True)
    if ours.reference_curve:
        earlier = json.loads(Path(ours.reference_curve).read_text().strip().splitlines()[-1])
        ref_loss, ref_s = earlier["reference_test_loss"], earlier["reference_seconds"]
        ref_curve = [tuple(c) for c in earlier["reference_curve"]]
        print(f"  reference reused from {ours.reference_curve}", flush=True)
    elif ours.only == "none":  # the branched curve alone: no reference line
        ref_loss, ref_s, ref_curve = None, None, []
    else:
        (ref_loss, _), ref_s, ref_curve = learning.run_reference(cfg, args, batch)
    ref_reach = ref_curve[-1][0] if ref_curve else ref_s
    if ref_loss is not None:
        print(f"  reference model.fit: test loss {ref_loss:.3f}, {ref_reach:.0f} s to its last snapshot", flush=True)

    rows: dict[str, dict] = {}
    chosen = recipes(args.steps, args.seq_len)
    names = list(chosen) if not ours.only else [n for n in ours.only.split(",") if n in chosen]
    for name in names:
        run_cfg = cfg.override({"output_dir": str(work / f"run-{name.replace(' ', '').replace('%', '')}"),
                                **chosen[name]})
        loss, seconds, curve = score_run(run_cfg, batch)
        reach = learning.time_to(curve, ref_loss)
        steps = learning.time_to(curve, ref_loss, at=1)
        rows[name] = {"final_loss": round(loss, 4), "seconds": round(seconds, 1), "curve": curve,
                      "seconds_to_reference": reach and round(reach, 1), "steps_to_reference": steps and round(steps),
                      "time_ratio": reach and round(reach / ref_reach, 3)}
        print(f"  {name}: final {loss:.3f}, " + (f"reaches {ref_loss:.3f} at step {steps:.0f}, {reach:.0f} s: ratio "
              f"{reach / ref_reach:.2f}" if reach is not None else "never reaches the reference's loss"), flush=True)

    if ref_loss is not None:
        print(f"\n| recipe | final test loss | steps to {ref_loss:.3f} | seconds to it | ratio to the reference's "
              f"{ref_reach:.0f} s |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for name, r in rows.items():
            print(f"| {name} | {r['final_loss']:.3f} | {r['steps_to_reference'] or 'never'} | "
                  f"{r['seconds_to_reference'] or '-'} | {r['time_ratio'] or '-'} |")
        if "linear" in rows and rows["linear"]["seconds_to_reference"]:
            base = rows["linear"]["seconds_to_reference"]
            for name, r in rows.items():
                if r["seconds_to_reference"]:
                    print(f"  {name}: {r['seconds_to_reference'] / base:.2f}x the linear recipe's time to the reference")

    points = []
    if ours.branches:
        points = branch_curve(cfg, batch, work, ours.branch_at, ours.decay_fraction)
        os.makedirs(os.path.dirname(ours.branch_plot), exist_ok=True)
        plot_branches(ours.branch_plot, points, {k: rows[k]["curve"] for k in ("linear", "wsd") if k in rows}, ref_loss)
        print(f"  branched decays -> {ours.branch_plot}: {points}")
    print(json.dumps({"reference_test_loss": ref_loss, "reference_seconds": ref_s, "reference_curve": ref_curve,
                      "reference_reach_seconds": ref_reach, "rows": rows, "branches": points}))


if __name__ == "__main__":
    main()
