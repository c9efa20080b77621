"""Domain vocabulary: does extending the checkpoint's tokenizer pay when continuing on a new domain?

The checkpoint is the quickstart's model (jobs/configs/quickstart.yaml: RoBERTa mini, BPE 2,000,
trained on CPython's documentation), trained here first or given with --source RUN. Both sides
continue it on WikiText-2 `valid.txt` through the real pipeline (`tpu-ray run` with
`model.init_from`), same steps, optimizer and schedule: "base" with the checkpoint's tokenizer,
"extended" with `tokenizer.extend_tokens=N` (N learned tokens, the model grown to them). Reported:
tokens per word on WikiText-2 `test.txt` under each run's tokenizer; the held-out loss in bits per
byte (comparable across tokenizers: a token's loss over the bytes it stands for) on the run's
validation split of the same text, at every evaluation; the wall time of each whole run.

    python benchmarks/vocabulary.py                          # trains the quickstart model first
    python benchmarks/vocabulary.py --source runs/quickstart # an existing quickstart run

Goal: tokens_per_word_ratio (extended / base) <= 0.85 and bpb_ratio (extended / base, at the end)
<= 1.0 at the same wall time or less. Last line: one JSON object with those figures.
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


def continue_run(work: Path, name: str, source: Path, args, extend: int | None) -> dict:
    """One side through the real pipeline; its eval records (step -> bits per byte), wall time, tokenizer."""
    from tpu_ray.config import load_run_config
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.report import load_metrics

    corpus = work / "valid.txt"
    if not corpus.exists():
        corpus.write_bytes((WIKITEXT / "valid.txt").read_bytes())
    overrides = [f"corpus.source={corpus}", f"model.init_from={source / 'model'}", f"train.steps={args.steps}",
                 f"train.eval_every={args.eval_every}", f"train.checkpoint_every={args.steps}",
                 f"train.warmup_steps={args.warmup}", f"train.learning_rate={args.lr}",
                 f"train.log_every={args.eval_every}", "ray.address=local", "ray.num_cpus=2"]
    if extend:
        overrides.append(f"tokenizer.extend_tokens={extend}")
    cfg = load_run_config(str(REPO / "jobs" / "configs" / "quickstart.yaml"), output_dir=str(work / name),
                          overrides=overrides)
    t = time.perf_counter()
    result = Pipeline(cfg).run()
    seconds = time.perf_counter() - t
    evals = load_metrics(str(work / name), kind="eval")
    evals = evals[evals["source"].isna()] if "source" in evals else evals  # the pooled record per step
    bpb = {int(r.step): float(r.bits_per_byte) for r in evals.itertuples()}
    tokens = {int(r.step): int(r.eval_tokens) for r in evals.itertuples()}
    summary = json.loads((work / name / "summary.json").read_text())
    return {"bpb": dict(sorted(bpb.items())), "eval_tokens": tokens, "seconds": seconds,
            "train_seconds": result.train_summary.get("train_seconds"), "tokenizer": str(work / name / "tokenizer"),
            "summary": summary.get("tokenizer", {})}


def wikitext_test_tokens_per_word(tokenizer_dir: str) -> float:
    from tokenizers import Tokenizer

    from tpu_ray.prepare.vocabulary import tokens_per_word

    lines = [s for s in (WIKITEXT / "test.txt").read_text(encoding="utf-8").splitlines() if s.strip()]
    return tokens_per_word(Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")), [lines])


def main() -> None:
    from continued import continuation_arguments, train_source

    p = continuation_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--extend", type=int, default=500, help="tokenizer.extend_tokens of the extended side")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="vocabulary-bench-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        source = Path(args.source) if args.source else train_source(work, args.source_steps)
        base = continue_run(work, "base", source, args, None)
        ext = continue_run(work, "extended", source, args, args.extend)
        tpw = {"base": wikitext_test_tokens_per_word(base["tokenizer"]), "extended": wikitext_test_tokens_per_word(ext["tokenizer"])}
    steps = sorted(set(base["bpb"]) & set(ext["bpb"]))
    last = steps[-1]
    print(f"source: {source} (quickstart model); continued {args.steps} steps on WikiText-2 valid (lr {args.lr}, "
          f"warm-up {args.warmup}); tokenizer.extend_tokens={args.extend} on the extended side")
    print(f"  tokens per word on WikiText-2 test: base {tpw['base']:.3f}, extended {tpw['extended']:.3f} "
          f"(on the run's corpus sample: {ext['summary'].get('tokens_per_word_before')} -> "
          f"{ext['summary'].get('tokens_per_word_after')}; {ext['summary'].get('added_tokens')} tokens added)")
    print("  held-out bits per byte (the validation split of valid.txt, all of it at each evaluation):")
    print(f"  {'step':>6s} {'base':>8s} {'extended':>9s} {'ratio':>7s}")
    for s in steps:
        print(f"  {s:6d} {base['bpb'][s]:8.4f} {ext['bpb'][s]:9.4f} {ext['bpb'][s] / base['bpb'][s]:7.3f}")
    print(f"  wall time (whole run: tokenizer, shards, training, export): base {base['seconds']:.0f} s, "
          f"extended {ext['seconds']:.0f} s; training alone {base['train_seconds']:.0f} s / "
          f"{ext['train_seconds']:.0f} s")
    # At equal wall time: the extended side's training seconds at each evaluation (steps take equal
    # time: seconds x step / steps), and the first evaluation where it is at or below base's final.
    reach = next((s for s in steps if ext["bpb"][s] <= base["bpb"][last]), None)
    reach_seconds = None if reach is None else ext["train_seconds"] * reach / last
    if reach is None:
        print(f"  extended never reaches base's final {base['bpb'][last]:.4f} bits per byte")
    else:
        print(f"  extended reaches base's final {base['bpb'][last]:.4f} bits per byte at step {reach} "
              f"(~{reach_seconds:.0f} s of training; base took {base['train_seconds']:.0f} s)")
    print(json.dumps({
        "tokens_per_word_ratio": round(tpw["extended"] / tpw["base"], 4),
        "bpb_ratio": round(ext["bpb"][last] / base["bpb"][last], 4),
        "tokens_per_word": {k: round(v, 4) for k, v in tpw.items()},
        "bpb_final": {"base": round(base["bpb"][last], 4), "extended": round(ext["bpb"][last], 4)},
        "wall_ratio": round(ext["seconds"] / base["seconds"], 3),
        "seconds_to_base_final_ratio": None if reach is None else round(reach_seconds / base["train_seconds"], 3),
        "seconds": {"base": round(base["seconds"], 1), "extended": round(ext["seconds"], 1)},
        "steps": last, "extend_tokens": args.extend}))


if __name__ == "__main__":
    main()
