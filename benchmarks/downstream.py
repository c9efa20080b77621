"""Did pretraining help the task? Three pretrained models fine-tuned on the built-in task, seeds on Ray.

The models (all the quickstart's recipe, jobs/configs/quickstart.yaml, the same steps on the domain):
- "scratch": from random weights on the domain, the built-in Python documentation (the quickstart);
- "continued": a general model (WikiText-2 `valid.txt`, benchmarks/domain_adaptation.py's) continued
  on the domain;
- "continued + replay": the same with 10% of the samples replayed from WikiText-2.
Each is fine-tuned on `builtin:stdlib-packages` (docstrings labelled by their package, docs/downstream.md)
through `tpu_ray.finetune`: seeds x learning rates as Ray tasks, each trial's epoch and the learning
rate chosen on validation, the score on the task's held-out test split, recorded in the run directory
(so `tpu-ray compare` prints the same verdicts). Reported per model: test accuracy at the learning
rate chosen on validation, mean ± sample sd over the seeds, against the model's bits per byte on the
domain's held-out text (comparable across tokenizers, unlike the loss per token); whether the MLM
order (lower bits per byte) is the downstream order (higher accuracy); and the verdict of scratch
against each continued model, paired by seed with its 95% interval (tpu_ray.downstream.verdict).

Then, on the continued model:
- fine-tuning throughput: tpu-ray's trial (`finetune_trial`, run in this process) against a plain
  Keras `model.fit` of the same model on the same encoded data, epochs and batch (Adam, no schedule),
  alternated `--repeats` times; examples/s each, the median ratio (goal >= 1.0);
- the seed sweep's wall time on a Ray cluster of 1 CPU (one trial at a time) against N CPUs.

    python benchmarks/downstream.py                      # ~30 min on 2 idle cores
    python benchmarks/downstream.py --work /tmp/ds       # keep the runs (and reuse them)
    python benchmarks/downstream.py --steps 300 --general-steps 300 --seeds 2 --epochs 2   # a smoke run

Last line: one JSON object with every figure above.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
TASK = "builtin:stdlib-packages"


def scratch_model(work: Path, steps: int, eval_samples: int) -> Path:
    """The quickstart from scratch on the Python docs, `steps` steps (the domain, no general model)."""
    from tpu_ray.config import load_run_config
    from tpu_ray.pipeline import Pipeline

    run = work / "scratch"
    if not (run / "model" / "config.json").exists():
        cfg = load_run_config(str(REPO / "jobs" / "configs" / "quickstart.yaml"), output_dir=str(run),
                              overrides=[f"train.steps={steps}", f"train.eval_every={steps}",
                                         f"train.checkpoint_every={steps}", f"eval.samples={eval_samples}",
                                         "ray.address=local", "ray.num_cpus=2"])
        Pipeline(cfg).run()
    return run


def domain_bits_per_byte(run: Path) -> float:
    """The run's last bits per byte on the domain's held-out text (the scratch run's one source is
    `corpus`; the continued runs name it `domain`)."""
    from tpu_ray.report import load_metrics

    ev = load_metrics(str(run), kind="eval_source")
    rows = ev[ev["source"].isin(["domain", "corpus"])].sort_values("step")
    return float(rows["bits_per_byte"].dropna().iloc[-1])


def sweep(run: Path, seeds: int, lrs: list[float] | None, epochs: int, num_cpus: int, out: Path | None = None):
    """`tpu_ray.finetune(run, TASK)` on a fresh local Ray cluster of `num_cpus` CPUs; (summary, wall s).
    Records go to the run directory (`out`: there instead); trials recorded there already are kept."""
    import ray

    import tpu_ray

    if ray.is_initialized():
        ray.shutdown()
    start = time.perf_counter()
    grid = {"finetune.learning_rates": lrs} if lrs else {}  # none: the model's default grid
    summary = tpu_ray.finetune(str(run), TASK, seeds=seeds, output_dir=str(out) if out else None,
                               overrides={**grid, "finetune.epochs": epochs, "ray.address": "local",
                                          "ray.num_cpus": num_cpus})
    return summary, time.perf_counter() - start


def plain_fit(model_dir: str, task, epochs: int, batch_size: int, lr: float, seed: int) -> float:
    """The baseline: the same model and encoded data through a plain Keras `model.fit`; examples/s."""
    import numpy as np
    import tensorflow as tf
    import tf_keras
    from transformers import AutoTokenizer, TFAutoModelForSequenceClassification

    from tpu_ray.downstream.finetune import FinetuneSpec, _encode

    tf_keras.utils.set_random_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = TFAutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=len(task.label_names),
                                                                 use_safetensors=False)
    length = min(FinetuneSpec().max_length, model.config.max_position_embeddings - 2)
    train = task.splits["train"]
    x = _encode(tok, train, task.has_pair, length, model.config.type_vocab_size)
    y = np.asarray([r["label"] for r in train], dtype=np.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(train), seed=seed).batch(batch_size)
    model.compile(optimizer=tf_keras.optimizers.Adam(lr))
    start = time.perf_counter()
    model.fit(data, epochs=epochs, verbose=0)
    return len(train) * epochs / (time.perf_counter() - start)


def throughput(model_dir: str, epochs: int, lr: float, repeats: int) -> dict[str, float]:
    """tpu-ray's trial against plain model.fit, alternated; examples/s medians and their ratio."""
    from tpu_ray.downstream.finetune import FinetuneSpec, finetune_trial
    from tpu_ray.downstream.tasks import load_task

    task, spec = load_task(TASK), FinetuneSpec(epochs=epochs)
    ours, plain = [], []
    for r in range(repeats):
        plain.append(plain_fit(model_dir, task, epochs, spec.batch_size, lr, seed=r))
        ours.append(finetune_trial(model_dir, task, seed=r, learning_rate=lr, spec=spec)["examples_per_s"])
    return {"tpu_ray_examples_per_s": statistics.median(ours), "plain_fit_examples_per_s": statistics.median(plain),
            "ratio": statistics.median(ours) / statistics.median(plain)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--general-steps", type=int, default=1000, help="steps of the general model on WikiText-2 valid")
    p.add_argument("--steps", type=int, default=1000, help="steps of each model on the domain")
    p.add_argument("--eval-samples", type=int, default=1280)
    p.add_argument("--lr", type=float, default=1e-3, help="pretraining learning rate of the continued runs")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--finetune-lrs", default="", help="fine-tuning learning rates, comma-separated (default: the "
                   "model's grid, finetune.default_learning_rates)")
    p.add_argument("--epochs", type=int, default=5, help="fine-tuning epochs")
    p.add_argument("--repeats", type=int, default=3, help="alternated throughput measurements")
    p.add_argument("--work", help="keep runs here (default: a temp dir)")
    args = p.parse_args()
    from domain_adaptation import continued, general_model

    logging.basicConfig(level=logging.WARNING)
    lrs = [float(x) for x in args.finetune_lrs.split(",")] if args.finetune_lrs else None
    cpus = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="downstream-bench-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        args.eval_every = args.steps  # domain_adaptation.continued reads these
        general = general_model(work, args.general_steps)
        continued(work, general, 0.0, args)
        continued(work, general, 0.10, args)
        runs = {"scratch": scratch_model(work, args.steps, args.eval_samples),
                "continued": work / "replay-00", "continued + 10% replay": work / "replay-10"}
        results, summaries = {}, {}
        for name, run in runs.items():
            summary, wall = sweep(run, args.seeds, lrs, args.epochs, cpus)
            summaries[name] = summary
            best = summary.best_lr
            mean, sd, n = summary.stats(best, summary.report_split)
            results[name] = {"bits_per_byte": domain_bits_per_byte(run), "test_accuracy_mean": mean,
                             "test_accuracy_sd": sd, "validation_accuracy_mean": summary.stats(best)[0], "seeds": n,
                             "chosen_lr": best, "chance": summary.chance, "sweep_s": wall,
                             "per_lr_validation": {f"{lr:g}": summary.stats(lr)[:2] for lr in sorted(summary.by_lr())}}
            print(f"{name}:", *summary.lines(), sep="\n", flush=True)
        from tpu_ray.downstream.verdict import paired

        base = summaries["scratch"]
        verdicts = {name: paired("scratch", base.seed_scores(), name, s.seed_scores(), base.metric, base.report_split)
                    for name, s in summaries.items() if name != "scratch"}
        model_dir = str(runs["continued"] / "model")
        speed = throughput(model_dir, args.epochs, base.best_lr, args.repeats)
        timing_lr = [summaries["continued"].best_lr]
        for d in ("one", "n"):  # fresh record directories: a kept trial would time nothing
            shutil.rmtree(work / "scores" / d, ignore_errors=True)
        one, wall_1 = sweep(runs["continued"], args.seeds, timing_lr, args.epochs, 1, out=work / "scores" / "one")
        _, wall_n = sweep(runs["continued"], args.seeds, timing_lr, args.epochs, cpus, out=work / "scores" / "n")

    chance = next(iter(results.values()))["chance"]
    print(f"\n{TASK}: test accuracy at the learning rate chosen on validation, mean ± sd over {args.seeds} seeds "
          f"(chance {chance:.3f}); pretraining {args.steps} steps on the Python docs; each trial's epoch of "
          f"{args.epochs} chosen on validation")
    grid_lrs = sorted({lr for r in results.values() for lr in r["per_lr_validation"]}, key=float)
    print(f"| model | domain bits/byte | test accuracy | validation | chosen lr | "
          f"{' | '.join(f'validation, lr {lr}' for lr in grid_lrs)} |")
    print("| --- | ---: | ---: | ---: | ---: |" + " ---: |" * len(grid_lrs))
    for name, r in results.items():
        per = " | ".join("{:.3f} ± {:.3f}".format(*r["per_lr_validation"][lr]) if lr in r["per_lr_validation"]
                         else "" for lr in grid_lrs)
        print(f"| {name} | {r['bits_per_byte']:.3f} | {r['test_accuracy_mean']:.3f} ± {r['test_accuracy_sd']:.3f} | "
              f"{r['validation_accuracy_mean']:.3f} | {r['chosen_lr']:g} | {per} |")
    by_mlm = sorted(results, key=lambda k: results[k]["bits_per_byte"])
    by_task = sorted(results, key=lambda k: -results[k]["test_accuracy_mean"])
    print(f"MLM order (lower bits/byte first): {by_mlm}; downstream order: {by_task}; "
          f"{'the same' if by_mlm == by_task else 'NOT the same'}")
    for v in verdicts.values():
        print(f"verdict: {v.words()}")
    print(f"fine-tuning throughput: tpu-ray {speed['tpu_ray_examples_per_s']:.1f} examples/s, plain model.fit "
          f"{speed['plain_fit_examples_per_s']:.1f}: {speed['ratio']:.2f}x (median of {args.repeats})")
    print(f"seed sweep ({args.seeds} seeds, lr {timing_lr[0]:g}): {wall_1:.0f} s on 1 CPU, {wall_n:.0f} s on {cpus}: "
          f"{wall_1 / wall_n:.2f}x")
    print(json.dumps({"task": TASK, "models": results, "mlm_order": by_mlm, "downstream_order": by_task,
                      "orders_match": by_mlm == by_task, "throughput": speed,
                      "verdicts": {k: {"mean_points": v.mean, "half_width": v.half_width, "seeds": len(v.seeds),
                                       "words": v.words()} for k, v in verdicts.items()},
                      "sweep_seconds": {"1": round(wall_1, 1), str(cpus): round(wall_n, 1)},
                      "one_cpu_test_accuracy": one.stats(timing_lr[0], one.report_split)[:2], "steps": args.steps,
                      "general_steps": args.general_steps, "epochs": args.epochs}))


if __name__ == "__main__":
    main()
