"""Continued pretraining vs from scratch: does starting from a checkpoint pay on a new domain?

The checkpoint is the quickstart's model (jobs/configs/quickstart.yaml: RoBERTa mini, BPE 2,000,
trained on CPython's documentation), trained here first or given with --source RUN. Both sides then
train on WikiText-2 `valid.txt` (shards cut with the checkpoint's tokenizer, in-process) for the
same steps, optimizer and schedule: "continued" with `model.init_from: SOURCE/model` (its weights,
a fresh optimizer), "scratch" the same architecture and tokenizer from random weights. Every
`--eval-every` steps both are scored on WikiText-2 `test.txt` (15% of its tokens masked with a
fixed seed: benchmarks/learning.py's evaluation) from their checkpoints.

    python benchmarks/continued.py                          # trains the quickstart model first
    python benchmarks/continued.py --source runs/quickstart # an existing quickstart run

Goal: continued below scratch at every evaluation, and reaching scratch's final test loss in at
most half the steps. Last line: {"continued_below_scratch_at_every_eval", "steps_to_scratch_final_ratio", ...}.
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
sys.path.insert(0, str(REPO / "benchmarks"))
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext-2"


def train_source(work: Path, steps: int) -> Path:
    """The quickstart run (its config, `steps` steps) into work/source, through the real pipeline."""
    from tpu_ray.config import load_run_config
    from tpu_ray.pipeline import Pipeline

    cfg = load_run_config(str(REPO / "jobs" / "configs" / "quickstart.yaml"), output_dir=str(work / "source"),
                          overrides=[f"train.steps={steps}", "ray.address=local", "ray.num_cpus=2"])
    if not (work / "source" / "model" / "config.json").exists():
        Pipeline(cfg).run()
    return work / "source"


def shards(work: Path, source: Path, seq_len: int):
    """WikiText-2 valid cut into shards with the checkpoint's tokenizer (no Ray: one process)."""
    from tokenizers import Tokenizer

    from tpu_ray.config import RunConfig
    from tpu_ray.prepare.corpus import plan_units
    from tpu_ray.pipeline import shard_job
    from tpu_ray.prepare.shards import process_unit, shard_set
    from tpu_ray.prepare.tokenizer import describe

    corpus = work / "valid.txt"
    corpus.write_bytes((WIKITEXT / "valid.txt").read_bytes())
    cfg = RunConfig.from_dict({
        "name": "continued", "output_dir": str(work / "prep"),
        "corpus": {"source": str(corpus), "validation_fraction": 0.0},
        "tokenizer": {"path": str(source / "tokenizer")},
        "shard": {"seq_len": seq_len, "unit_bytes": 65536, "dir": str(work / "shards")},
    })
    if not (work / "shards" / "manifest.json").exists():
        tok = Tokenizer.from_file(str(source / "tokenizer" / "tokenizer.json"))
        info = describe(tok.to_str(), "bench")
        units = plan_units(cfg.corpus, cfg.shard, cfg.run_dir)
        os.makedirs(cfg.shards_dir, exist_ok=True)
        results = {u.index: process_unit(u, tok, info, seq_len, cfg.shards_dir) for u in units}
        shard_set(shard_job(cfg), info, units, results, complete=True).write()
    return cfg


def run(work: Path, name: str, prep, source: Path, args) -> dict[int, float]:
    """Train one side; its test loss at every checkpoint (step -> nats)."""
    import tensorflow as tf
    from transformers import TFAutoModelForMaskedLM

    from learning import evaluate, test_batch
    from tpu_ray.config import RunConfig
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.init_from import checkpoint_fields
    from tpu_ray.train.loop import train
    from tpu_ray.train.model import hf_config

    src_cfg = RunConfig.from_yaml(str(source / "config.yaml"))
    over = {
        "name": name, "output_dir": str(work / name), "shard": prep.shard.model_dump(), "tokenizer": prep.tokenizer.model_dump(),
        "corpus": prep.corpus.model_dump(), "model": src_cfg.model.model_dump(),
        "train": {**src_cfg.train.model_dump(), "steps": args.steps, "eval_every": 10**9,
                  "checkpoint_every": args.eval_every, "keep_checkpoints": 10**6, "learning_rate": args.lr,
                  "warmup_steps": args.warmup, "placement": "local", "log_every": args.eval_every},
    }
    cfg = RunConfig.from_dict(over)
    if name == "continued":
        cfg = cfg.override({"model.init_from": str(source / "model")})
        cfg = cfg.override(checkpoint_fields(cfg.init_spec))
    spec = cfg.model_spec
    if not (work / name / "model" / "config.json").exists():
        t = time.perf_counter()
        train(cfg)
        print(f"  {name}: trained {args.steps} steps in {time.perf_counter() - t:.0f} s", flush=True)
    batch = test_batch(cfg)
    model = TFAutoModelForMaskedLM.from_config(hf_config(spec, tokenizer_info(cfg.tokenizer_dir)))
    model(model.dummy_inputs, training=False)
    out = {}
    if name == "continued":  # step 0: the checkpoint itself, before any step on the new domain
        ref = TFAutoModelForMaskedLM.from_pretrained(str(source / "model"), use_safetensors=False)
        out[0] = evaluate(ref, batch)[0]
    else:
        tf.keras.utils.set_random_seed(cfg.seed)
        out[0] = evaluate(TFAutoModelForMaskedLM.from_config(hf_config(spec, tokenizer_info(cfg.tokenizer_dir))), batch)[0]
    state = tf.train.get_checkpoint_state(str(work / name / "checkpoints"))
    for path in state.all_model_checkpoint_paths:
        tf.train.Checkpoint(model=model).restore(path).expect_partial()
        out[int(path.rsplit("-", 1)[1])] = evaluate(model, batch)[0]
    return dict(sorted(out.items()))


def continuation_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of a benchmark that continues the quickstart's model (this one, vocabulary.py)."""
    p.add_argument("--source", help="an existing quickstart run directory (default: train one here)")
    p.add_argument("--source-steps", type=int, default=2000, help="steps of the quickstart run trained here")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--work", help="keep runs here (default: a temp dir)")
    return p


def main() -> None:
    args = continuation_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0])).parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="continued-bench-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        source = Path(args.source) if args.source else train_source(work, args.source_steps)
        from tpu_ray.config import RunConfig

        seq_len = RunConfig.from_yaml(str(source / "config.yaml")).shard.seq_len
        prep = shards(work, source, seq_len)
        scratch = run(work, "scratch", prep, source, args)
        continued = run(work, "continued", prep, source, args)
        seconds = time.perf_counter() - t0
    steps = sorted(set(scratch) & set(continued))
    final = scratch[steps[-1]]
    reach = next((s for s in steps if continued[s] <= final), None)
    below = all(continued[s] < scratch[s] for s in steps)
    print(f"source: {source} (quickstart model); WikiText-2 valid -> train, test held out; {args.steps} steps, "
          f"lr {args.lr}, warm-up {args.warmup}; test loss (nats) at each evaluation")
    print(f"  {'step':>6s} {'scratch':>9s} {'continued':>10s}")
    for s in steps:
        print(f"  {s:6d} {scratch[s]:9.3f} {continued[s]:10.3f}")
    ratio = None if reach is None else round(reach / steps[-1], 3)
    print(f"  continued reaches scratch's final {final:.3f} at step {reach} of {steps[-1]}")
    print(json.dumps({"continued_below_scratch_at_every_eval": below, "steps_to_scratch_final_ratio": ratio,
                      "scratch_final": round(final, 4), "continued_final": round(continued[steps[-1]], 4),
                      "steps": steps[-1], "seconds": round(seconds, 1)}))


if __name__ == "__main__":
    main()
