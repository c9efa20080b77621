"""Domain adaptation with replay: how much general text keeps a continued model from forgetting?

A "general" model is trained on WikiText-2 `valid.txt` (the quickstart's model and recipe, on
WikiText instead of the Python docs). It is then continued on a "domain", the built-in Python
documentation, for the same steps with replay of WikiText at 0%, 10% and 25% of the samples
(`corpus.sources`: domain + general by weight, and WikiText-2 `test.txt` as an evaluation-only
source). Every evaluation scores the domain's held-out split and WikiText-2 `test` on their fixed
sets (tpu-ray's per-source evaluation, 15% masked); step 0 is the general model itself.

    python benchmarks/domain_adaptation.py                    # ~10 min on 2 idle cores
    python benchmarks/domain_adaptation.py --work /tmp/da     # keep the runs (and reuse them)

Prints the table (per replay rate: domain and general loss at the start and the end) and, last,
one JSON line: forgetting_ratio (the general loss's rise with 10% replay over its rise without
replay) and domain_cost (domain loss with 10% replay minus without, nats). Goal: forgetting_ratio
<= 0.5 with domain_cost <= 0.15.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext-2"
REPLAY = (0.0, 0.10, 0.25)


def general_model(work: Path, steps: int) -> Path:
    """The quickstart's recipe trained on WikiText-2 valid: the published checkpoint stand-in."""
    from tpu_ray.config import load_run_config
    from tpu_ray.pipeline import Pipeline

    run = work / "general"
    if not (run / "model" / "config.json").exists():
        cfg = load_run_config(str(REPO / "jobs" / "configs" / "quickstart.yaml"), output_dir=str(run),
                              corpus=str(WIKITEXT / "valid.txt"),
                              overrides=[f"train.steps={steps}", "train.eval_every=1000000", "ray.address=local",
                                         "ray.num_cpus=2"])
        Pipeline(cfg).run()
    return run


def continued(work: Path, general: Path, replay: float, args, schedule: dict | None = None,
              tag: str = "") -> dict[str, dict[int, float]]:
    """Continue `general` on the domain with `replay` of WikiText; per source, loss at each evaluation.
    `schedule`: train.* schedule fields of this continued run (`--schedules`), its run named `tag`."""
    from tpu_ray.config import RunConfig
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.report import load_metrics

    run = work / f"replay-{int(replay * 100):02d}{tag}"
    sources = {"domain": {"source": "builtin:python-docs", "weight": 1.0 - replay, "validation_fraction": 0.05},
               "general_test": {"source": str(WIKITEXT / "test.txt"), "weight": 0}}
    if replay:
        sources["general"] = {"source": str(WIKITEXT / "valid.txt"), "weight": replay, "validation_fraction": 0.0}
    base = RunConfig.from_yaml(str(general / "config.yaml"))
    cfg = RunConfig.from_dict({
        "name": run.name, "output_dir": str(run), "seed": 0, "corpus": {"sources": sources},
        "shard": {"seq_len": base.shard.seq_len, "unit_bytes": 262144},
        "model": {"init_from": str(general / "model"), "dropout": 0.0},
        "train": {**base.train.model_dump(exclude={"eval_every", "checkpoint_every", "log_every", "warmup_steps"}),
                  "steps": args.steps, "learning_rate": args.lr, "warmup_steps": args.warmup,
                  "eval_every": args.eval_every, "checkpoint_every": args.steps, "log_every": args.eval_every,
                  "placement": "local", **(schedule or {})},
        "eval": {"samples": args.eval_samples},
        "ray": {"address": "local", "num_cpus": 2}})
    if not (run / "model" / "config.json").exists():
        t = time.perf_counter()
        Pipeline(cfg).run()
        print(f"  replay {replay:.0%}: {args.steps} steps in {time.perf_counter() - t:.0f} s", flush=True)
    df = load_metrics(str(run), kind="eval_source")
    return {name: dict(zip(rows["step"].astype(int), rows["eval_loss"])) for name, rows in df.groupby("source")}


def plot(curves: dict[float, dict[str, dict[int, float]]], path: str) -> None:
    """Domain loss (left) and general loss (right) against steps, one line per replay rate."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=110, layout="constrained")
    for ax, (source, title) in zip(fig.subplots(1, 2), (("domain", "domain (Python docs, held out)"),
                                                        ("general_test", "general (WikiText-2 test)"))):
        for replay, c in curves.items():
            steps = sorted(c[source])
            ax.plot(steps, [c[source][s] for s in steps], "o-", ms=4, label=f"replay {replay:.0%}")
        ax.set_title(title)
        ax.set_xlabel("step of the continued run")
        ax.set_ylabel("eval loss (nats)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.savefig(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--general-steps", type=int, default=1000, help="steps of the general model on WikiText-2 valid")
    p.add_argument("--steps", type=int, default=1000, help="steps of each continued run")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-samples", type=int, default=1280)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--work", help="keep runs here (default: a temp dir)")
    p.add_argument("--plot", help="also draw both losses against steps, per replay rate, into this PNG")
    p.add_argument("--schedules", help="compare these learning-rate schedules (comma-separated: linear, cosine, wsd, "
                   "constant) of the continued run at 10%% replay instead of the replay rates (docs/schedules.md)")
    args = p.parse_args()
    if args.schedules:
        return compare_schedules(args)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="domain-bench-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        general = general_model(work, args.general_steps)
        curves = {r: continued(work, general, r, args) for r in REPLAY}
        seconds = time.perf_counter() - t0
    print(f"general model: quickstart recipe, {args.general_steps} steps on WikiText-2 valid; continued "
          f"{args.steps} steps on the Python docs, lr {args.lr}; eval loss (nats, 15% masked, fixed sets)")
    print(f"  {'replay':>6s} {'domain start':>13s} {'domain end':>11s} {'general start':>14s} {'general end':>12s}")
    rows = {}
    for r, c in curves.items():
        dom, gen = c["domain"], c["general_test"]
        first, last = min(dom), max(dom)
        rows[r] = (dom[first], dom[last], gen[first], gen[last])
        print(f"  {r:6.0%} {rows[r][0]:13.3f} {rows[r][1]:11.3f} {rows[r][2]:14.3f} {rows[r][3]:12.3f}")
    if args.plot:
        plot(curves, args.plot)
    rise = {r: rows[r][3] - rows[r][2] for r in rows}
    ratio = rise[0.10] / rise[0.0] if rise[0.0] > 0 else None
    cost = rows[0.10][1] - rows[0.0][1]
    print(json.dumps({"forgetting_ratio": None if ratio is None else round(ratio, 3), "domain_cost": round(cost, 4),
                      "general_rise": {f"{r:.0%}": round(v, 4) for r, v in rise.items()},
                      "domain_end": {f"{r:.0%}": round(rows[r][1], 4) for r in rows},
                      "steps": args.steps, "seconds": round(seconds, 1)}))


SCHEDULES = {"linear": {}, "cosine": {"schedule": "cosine"}, "constant": {"schedule": "constant"},
             "wsd": {"schedule": "wsd", "decay_fraction": 0.2, "decay_shape": "1-sqrt"}}


def compare_schedules(args) -> None:
    """The continued run (10% replay) under each schedule: domain loss gained, general loss lost."""
    names = args.schedules.split(",")
    unknown = [n for n in names if n not in SCHEDULES]
    if unknown:
        sys.exit(f"--schedules: unknown {unknown}; pick from {', '.join(SCHEDULES)}")
    with tempfile.TemporaryDirectory(prefix="domain-bench-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        general = general_model(work, args.general_steps)
        curves = {}
        for name in names:
            t = time.perf_counter()
            curves[name] = continued(work, general, 0.10, args, SCHEDULES[name], "" if name == "linear" else f"-{name}")
            print(f"  {name}: {time.perf_counter() - t:.0f} s", flush=True)
    print(f"continued {args.steps} steps on the Python docs from the general model, 10% WikiText replay, peak lr "
          f"{args.lr}, warm-up {args.warmup}; eval loss (nats, 15% masked, fixed sets)")
    print("| schedule | domain start | domain end | general start | general end | general rise |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    out = {}
    for name, c in curves.items():
        dom, gen = c["domain"], c["general_test"]
        first, last = min(dom), max(dom)
        out[name] = {"domain_end": round(dom[last], 4), "general_rise": round(gen[last] - gen[first], 4)}
        print(f"| {name} | {dom[first]:.3f} | {dom[last]:.3f} | {gen[first]:.3f} | {gen[last]:.3f} | "
              f"{gen[last] - gen[first]:+.3f} |")
    print(json.dumps({"schedules": out, "steps": args.steps, "replay": 0.10}))


if __name__ == "__main__":
    main()
