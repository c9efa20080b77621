"""Does the model learn from context? tpu-ray's trainer against the reference `model.fit` loop.

WikiText-2: `valid.txt` trains (tokenizer and shards), `test.txt` is held out. One tokenizer and
one set of shards feed both sides; both train the same model for the same steps with the same
optimizer and schedule (transformers' `create_optimizer`: warm-up, then linear decay). Then one
masked-LM evaluation written here scores both: 15% of the test tokens (not [CLS]/[SEP]; <unk> is a
target on both sides) replaced by [MASK] with a fixed seed, cross-entropy and top-1 accuracy on
those positions. The baseline is what a model without context can do: the word (token) frequencies
counted in the training shards, the same prediction at every position.

    python benchmarks/learning.py                   # table, then one JSON line
    python benchmarks/learning.py --skip-reference  # tpu-ray and the baseline only (tuning)
    python benchmarks/learning.py --mask-prob 0.15  # tpu-ray with the reference's own recipe
    python benchmarks/learning.py --skip-reference --reference-curve LAST_LINE.json --set train.whole_word_mask=true

tpu-ray's side runs the recipe jobs/configs/quickstart.yaml ships, measured fastest to quality
(docs/schedules.md): 30% of tokens masked, an exact count per sequence (`train.mask_count=exact`),
the `wsd` schedule (the last 20% a 1-sqrt decay) and the head's output bias started at the
training tokens' log frequencies (`model.output_bias=unigram`); the reference masks 15% as it
always did and keeps its linear decay, and the evaluation masks 15%. Each is a lever
(`--schedule linear --output-bias zeros` is the recipe before issue 49; `--set
train.mask_schedule=linear --set train.mask_prob_end=0.15`). The defaults (BPE vocab 4000,
1500 steps, lr 2e-3, warm-up 100) are the setting measured to learn
from context on 2 cores in about 5 minutes for tpu-ray's trainer (README, "Does it learn?"). With
vocab 8000 two runs of one setting ended 0.6 nats apart (5.90 and 6.50): the model was still
leaving the word-frequency plateau at the last step, so the result hung on when it left it.

Time to quality (issue 24): both trainers keep a snapshot of the weights every `--snapshot-every`
steps (tpu-ray: its own checkpoints, written as in any run; the reference: a Keras callback copies
the weights to memory, and the copy's time is taken off its clock), each stamped with the seconds
since that trainer started. After training, the same held-out evaluation scores every snapshot, so
the evaluation stays outside both trainers. The figure: the seconds tpu-ray needs to reach the
reference's final test loss (linear between snapshots), and its ratio to the seconds the reference
needed to reach it (its last snapshot; `..._vs_wall`: to model.fit's whole wall time). With
`--set KEY=VALUE` a recipe lever changes tpu-ray's side only; `steps_to_reference` is the same
figure in steps, which the machine's load does not move.
`--plot PNG` draws both curves (test loss against seconds).

Last line: {"tpu_ray_test_loss", "reference_test_loss", "baseline_loss", "tpu_ray_top1",
"reference_top1", "baseline_top1", "tpu_ray_seconds", "reference_seconds",
"time_to_reference_seconds", "time_to_reference_ratio", "tpu_ray_curve", "reference_curve", ...}.
Seconds are wall time of training (model build, tracing, steps; tpu-ray's also includes its
checkpoints and export).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
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

EVAL_SEED = 1234
EVAL_MASK_PROB = 0.15


def prepare(work: Path, args, extra_lengths: tuple[int, ...] = ()) -> object:
    """Tokenizer and shards from WikiText-2's valid split only (in-process, no Ray needed).
    `extra_lengths`: also cut the train tokens at these lengths (train.phases' shorter phases, in
    `<shards>/seq-L`), from the same tokenization; the full-length shards are the same either way."""
    from tokenizers import Tokenizer

    from tpu_ray.config import RunConfig
    from tpu_ray.prepare.corpus import plan_units
    from tpu_ray.pipeline import shard_job
    from tpu_ray.prepare.shards import length_sets, process_unit, shard_set
    from tpu_ray.prepare.tokenizer import describe, save_tokenizer, train_tokenizer

    corpus = work / "train.txt"
    if not corpus.exists():
        corpus.write_bytes((WIKITEXT / "valid.txt").read_bytes())
    cfg = RunConfig.from_dict({
        "name": "learning", "output_dir": str(work / "run"),
        "corpus": {"source": str(corpus), "validation_fraction": 0.0},
        "tokenizer": {"kind": args.tokenizer, "vocab_size": args.vocab, "path": str(work / "tokenizer")},
        "shard": {"seq_len": args.seq_len, "unit_bytes": 65536, "dir": str(work / "shards")},
        "model": {"hidden_size": args.hidden, "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
                  "intermediate_size": 4 * args.hidden, "dropout": args.dropout, "output_bias": args.output_bias,
                  "initializer_range": args.initializer_range},
        "train": {"steps": args.steps, "batch_size": args.batch, "learning_rate": args.lr,
                  "warmup_steps": args.warmup, "schedule": args.schedule, "decay_fraction": args.decay_fraction,
                  "decay_shape": args.decay_shape, "eval_every": 10**6,
                  "checkpoint_every": args.snapshot_every, "keep_checkpoints": 10**6, "log_every": 50,
                  "shuffle_buffer": 4096, "mask_prob": args.mask_prob, "mask_count": args.mask_count,
                  "jit_compile": args.jit},
    })
    if (work / "shards" / "manifest.json").exists():  # --work of an earlier run: the same tokenizer/shards
        return cfg
    lines = [s for s in corpus.read_text().splitlines() if s.strip()]
    info = save_tokenizer(train_tokenizer([lines], cfg.tokenizer), str(work / "tokenizer"), cfg.max_input_tokens())
    tok = Tokenizer.from_file(str(work / "tokenizer" / "tokenizer.json"))
    units = plan_units(cfg.corpus, cfg.shard, cfg.run_dir)
    os.makedirs(cfg.shards_dir, exist_ok=True)
    results = {u.index: process_unit(u, tok, info, args.seq_len, cfg.shards_dir, extra_lengths=extra_lengths)
               for u in units}
    shard_set(shard_job(cfg), describe(tok.to_str(), "bench"), units, results, complete=True).write()
    for length in extra_lengths:  # train.phases' shorter lengths: their own manifests (train/phases.py)
        phased = cfg.override({"train.phases": [{"steps": 1, "seq_len": length}, {"steps": 1, "seq_len": args.seq_len}]})
        for sub in length_sets(shard_job(phased), describe(tok.to_str(), "bench"), units, results, complete=True):
            sub.write()
    return cfg


def test_batch(cfg) -> dict:
    """The held-out text as shards are cut, 15% of its tokens masked with a fixed seed."""
    import numpy as np
    from tokenizers import Tokenizer

    from tpu_ray.prepare.shards import chunk_ids, encode_lines, never_text_ids
    from tpu_ray.prepare.tokenizer import tokenizer_info

    info = tokenizer_info(cfg.tokenizer_dir)
    tok = Tokenizer.from_file(str(Path(cfg.tokenizer_dir) / "tokenizer.json"))
    lines = [s for s in (WIKITEXT / "test.txt").read_text().splitlines() if s.strip()]
    rows, _, _ = chunk_ids(encode_lines(tok, lines, never_text_ids(info)), cfg.shard.seq_len, info.cls_id,
                           info.sep_id)  # as the shard actors encode (issue 23.7)
    rng = np.random.default_rng(EVAL_SEED)
    targets = (rng.random(rows.shape) < EVAL_MASK_PROB) & ~np.isin(rows, [info.cls_id, info.sep_id, info.pad_id])
    inputs = np.where(targets, info.mask_id, rows)
    return {"input_ids": inputs, "labels": rows, "targets": targets}


def evaluate(model, batch: dict, batch_size: int = 64) -> tuple[float, float]:
    """Mean cross-entropy (nats) and top-1 accuracy over the masked test positions."""
    import numpy as np
    import tensorflow as tf

    total, correct, count = 0.0, 0, 0
    for i in range(0, len(batch["input_ids"]), batch_size):
        ids = batch["input_ids"][i:i + batch_size]
        sel = batch["targets"][i:i + batch_size]
        # The encoder on every position, the MLM head on the masked ones only (the same logits as
        # model(...).logits there, without projecting the other 85% onto the vocabulary).
        hidden = getattr(model, model.base_model_prefix)(
            input_ids=tf.constant(ids, tf.int32), attention_mask=tf.ones_like(ids, tf.int32), training=False)[0]
        picked = model.lm_head(tf.boolean_mask(hidden, sel)[None], training=False)[0].numpy().astype(np.float64)
        labels = batch["labels"][i:i + batch_size][sel]
        logz = np.log(np.exp(picked - picked.max(-1, keepdims=True)).sum(-1)) + picked.max(-1)
        total += float((logz - picked[np.arange(len(labels)), labels]).sum())
        correct += int((picked.argmax(-1) == labels).sum())
        count += len(labels)
    return total / count, correct / count


def baseline(cfg, batch: dict) -> tuple[float, float]:
    """Token frequencies in the training shards (add-one smoothed) as the same prediction everywhere."""
    import numpy as np

    from tpu_ray.prepare.shard_set import ShardSet
    from tpu_ray.prepare.tfrecord import read_records
    from tpu_ray.prepare.tokenizer import tokenizer_info
    import tensorflow as tf

    info = tokenizer_info(cfg.tokenizer_dir)
    counts = np.ones(info.vocab_size)
    spec = {"input_ids": tf.io.FixedLenFeature([cfg.shard.seq_len], tf.int64)}
    for path, _ in ShardSet.open(cfg.shards_dir).files("train"):
        with open(path, "rb") as f:
            records = list(read_records(f))
        ids = tf.io.parse_example(records, spec)["input_ids"].numpy().ravel()
        counts += np.bincount(ids, minlength=info.vocab_size)
    for special in (info.cls_id, info.sep_id, info.pad_id, info.mask_id):
        counts[special] = 0  # never a target
    with np.errstate(divide="ignore"):  # the special ids: -inf, never looked up
        logp = np.log(counts / counts.sum())
    labels = batch["labels"][batch["targets"]]
    return float(-logp[labels].mean()), float((labels == counts.argmax()).mean())


def run_tpu_ray(cfg, work: Path, batch: dict):
    """Train; then score each checkpoint the run kept: [(seconds since start, step, loss)]."""
    import tensorflow as tf
    from transformers import TFAutoModelForMaskedLM

    from tpu_ray.train.loop import train

    start, t = time.time(), time.perf_counter()
    summary = train(cfg)
    seconds = time.perf_counter() - t
    records = [json.loads(x) for x in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], round(r["loss"], 3)) for r in records if r["kind"] == "train"]
    # use_safetensors=False: the export also holds model.safetensors (PyTorch layout), which TF
    # Transformers 4.57 prefers and cannot read (transformers #40028); tf_model.h5 is the TF weights.
    model = TFAutoModelForMaskedLM.from_pretrained(summary["model_dir"], use_safetensors=False)
    final = evaluate(model, batch)
    ckpt_dir = Path(cfg.run_dir) / "checkpoints"
    saved = {int(p.name[5:-6]): p.with_suffix("") for p in ckpt_dir.glob("ckpt-*.index")}
    # A checkpoint's time: its file's commit, relative to the start (what it cost is on the clock).
    curve = []
    for step in sorted(saved):
        tf.train.Checkpoint(model=model).restore(str(saved[step])).expect_partial()
        stamp = saved[step].with_suffix(".index").stat().st_mtime - start
        curve.append((round(stamp, 1), step, round(evaluate(model, batch)[0], 4)))
    return final, seconds, losses, curve


def run_reference(cfg, args, batch: dict):
    """model.fit as it is; a callback copies the weights every snapshot_every steps (off the clock)."""
    import tf_keras
    from train_throughput import reference_fit

    snaps: list[tuple[float, int, list]] = []
    t = time.perf_counter()
    state = {"off": 0.0}

    class Snapshot(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            if (step + 1) % args.snapshot_every == 0:
                t0 = time.perf_counter()
                weights = self.model.get_weights()
                state["off"] += time.perf_counter() - t0
                snaps.append((time.perf_counter() - t - state["off"], step + 1, weights))

    # The reference starts as transformers builds a model (its initializer_range; the output bias is
    # tpu-ray's trainer's own): a start lever of tpu-ray's recipe must not move the baseline.
    as_built = cfg.override({"model.initializer_range": None, "model.output_bias": "zeros"})
    model, _ = reference_fit(as_built, args.steps, lr=args.lr, warmup_steps=args.warmup, seq_len=args.seq_len,
                             batch=args.batch, callbacks=[Snapshot()])
    seconds = time.perf_counter() - t - state["off"]
    final = evaluate(model, batch)
    curve = []
    for stamp, step, weights in snaps:
        model.set_weights(weights)
        curve.append((round(stamp, 1), step, round(evaluate(model, batch)[0], 4)))
    return final, seconds, curve


def time_to(curve: list[tuple[float, int, float]], target: float, at: int = 0) -> float | None:
    """Seconds (at=0) or steps (at=1) at which a (seconds, step, loss) curve first reaches `target`
    (linear between points)."""
    prev = None
    for point in curve:
        if point[2] <= target:
            if prev is None:
                return point[at]
            (l0, l1), (x0, x1) = (prev[2], point[2]), (prev[at], point[at])
            return x0 + (x1 - x0) * (l0 - target) / (l0 - l1) if l0 != l1 else x1
        prev = point
    return None


def plot(path: str, curves: dict[str, list], target: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, curve in curves.items():
        if curve:
            ax.plot([c[0] for c in curve], [c[2] for c in curve], marker="o", ms=3, label=label)
    if target is not None:
        ax.axhline(target, color="grey", ls="--", lw=0.8, label="reference final loss")
    ax.set_xlabel("seconds of training (2 CPU cores)")
    ax.set_ylabel("WikiText-2 test loss (masked tokens, nats)")
    ax.set_title("Time to quality: tpu-ray's trainer vs the reference model.fit")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parser() -> argparse.ArgumentParser:
    """The benchmark's setting (benchmarks/schedules.py reads the same)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--tokenizer", default="bpe", choices=["unigram", "bpe", "wordpiece"])
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--mask-prob", type=float, default=0.3,
                   help="tpu-ray's masking rate (the reference's stays 0.15): 0.3 measured best (README, Time to quality)")
    p.add_argument("--mask-count", default="exact", choices=["exact", "random"],
                   help="tpu-ray's train.mask_count: exact, what jobs/configs ship (issue 38), or random")
    # tpu-ray's recipe: jobs/configs/quickstart.yaml's (tests/test_run_start.py keeps them equal), the
    # one measured fastest to the reference's loss (docs/schedules.md, issue 49).
    p.add_argument("--schedule", default="wsd", choices=["linear", "cosine", "constant", "wsd"],
                   help="tpu-ray's train.schedule (the reference keeps create_optimizer's linear decay)")
    p.add_argument("--decay-fraction", type=float, default=0.2, help="tpu-ray's train.decay_fraction (wsd)")
    p.add_argument("--decay-shape", default="1-sqrt", choices=["1-sqrt", "linear"], help="tpu-ray's train.decay_shape (wsd)")
    p.add_argument("--output-bias", default="unigram", choices=["zeros", "unigram"],
                   help="tpu-ray's model.output_bias: the head's bias at the training tokens' log frequencies")
    p.add_argument("--initializer-range", type=float, default=0.04,
                   help="tpu-ray's model.initializer_range: the std of the fresh weights (transformers' is 0.02)")
    p.add_argument("--jit", type=lambda v: {"true": True, "false": False, "auto": None}[v.lower()], default=None,
                   help="tpu-ray's train.jit_compile: true, false or auto (the strategy's default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for tpu-ray's side only (a recipe lever), e.g. "
                        "train.whole_word_mask=true; repeatable; the reference stays as it is")
    p.add_argument("--snapshot-every", type=int, default=100, help="steps between scored snapshots")
    p.add_argument("--plot", help="write the test-loss-against-seconds curves to this PNG")
    p.add_argument("--reference-curve", help="a JSON line of an earlier run: its reference side is reused "
                   "(with --skip-reference; tuning tpu-ray against one measured reference)")
    p.add_argument("--skip-reference", action="store_true", help="train tpu-ray only (for tuning)")
    p.add_argument("--skip-tpu-ray", action="store_true",
                   help="train the reference only (with --work of a tpu-ray run: same tokenizer and shards)")
    p.add_argument("--work", help="keep the tokenizer, shards and runs here (default: a temp dir)")
    return p


def main() -> None:
    args = parser().parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="learning-bench-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        cfg = prepare(work, args)
        if args.set:
            cfg = cfg.override(args.set)
        batch = test_batch(cfg)
        base_loss, base_top1 = baseline(cfg, batch)
        ours_loss = ours_top1 = ours_s = None
        curve: list = []
        ours_curve: list = []
        if not args.skip_tpu_ray:
            (ours_loss, ours_top1), ours_s, curve, ours_curve = run_tpu_ray(cfg, work, batch)
        ref_loss = ref_top1 = ref_s = None
        ref_curve: list = []
        if not args.skip_reference:
            (ref_loss, ref_top1), ref_s, ref_curve = run_reference(cfg, args, batch)
        elif args.reference_curve:
            earlier = json.loads(Path(args.reference_curve).read_text().strip().splitlines()[-1])
            ref_loss, ref_top1, ref_s = (earlier[k] for k in ("reference_test_loss", "reference_top1",
                                                               "reference_seconds"))
            ref_curve = [tuple(c) for c in earlier["reference_curve"]]

    n = int(batch["targets"].sum())
    print(f"WikiText-2 valid -> train, test held out ({n:,} masked test tokens); model hidden {args.hidden}, "
          f"{args.layers} layers, {args.tokenizer} vocab {args.vocab}, seq_len {args.seq_len}, batch {args.batch}, "
          f"{args.steps} steps, lr {args.lr} (warm-up {args.warmup}, {cfg.train.schedule} schedule), dropout {args.dropout}, "
          f"output bias {cfg.model.output_bias}, initializer_range {cfg.model.initializer_range}")
    print(f"  tpu-ray train loss every 50 steps: {curve}")
    print(f"  {'':30s} {'test loss':>10s} {'top-1':>7s} {'seconds':>8s}")
    print(f"  {'word-frequency baseline':30s} {base_loss:10.3f} {base_top1:7.1%} {'':>8s}")
    if ours_loss is not None:
        print(f"  {'tpu-ray trainer':30s} {ours_loss:10.3f} {ours_top1:7.1%} {ours_s:8.0f}")
    if ref_loss is not None:
        top1 = f"{ref_top1:7.1%}" if ref_top1 is not None else f"{'':>7s}"  # a reused curve may not hold it
        print(f"  {'reference model.fit':30s} {ref_loss:10.3f} {top1} {ref_s:8.0f}")
    reach = ratio = ratio_wall = reach_steps = None
    if ours_loss is not None and ref_loss is not None:
        print(f"  tpu-ray vs reference: {ref_loss - ours_loss:+.3f} nats, {ref_s / ours_s:.2f}x faster")
        reach = time_to(ours_curve, ref_loss)
        # The reference's time to its own final loss: its last snapshot's stamp (model.fit's wall time
        # also holds ~45 s after its last step, which would flatter the ratio); the wall ratio is kept too.
        ref_reach = ref_curve[-1][0] if ref_curve else ref_s
        ratio = reach / ref_reach if reach is not None else None
        ratio_wall = reach / ref_s if reach is not None else None
        # Steps are what a recipe lever changes and do not depend on how loaded the machine was.
        reach_steps = time_to(ours_curve, ref_loss, at=1)
        print(f"  test loss by seconds (every {args.snapshot_every} steps): tpu-ray {ours_curve}")
        print(f"  {'':37s}reference {ref_curve}")
        print(f"  time to the reference's final test loss {ref_loss:.3f}: tpu-ray "
              + (f"{reach:.0f} s against the reference's {ref_reach:.0f} s: ratio {ratio:.2f} "
                 f"({ratio_wall:.2f} of its {ref_s:.0f} s wall time); "
                 f"{reach_steps:.0f} of its {args.steps} steps" if reach is not None else "never reached it"))
    if args.plot:
        plot(args.plot, {"tpu-ray trainer": ours_curve, "reference model.fit": ref_curve}, ref_loss)
    if ours_loss is not None:
        print(f"  tpu-ray vs baseline: {base_loss - ours_loss:+.3f} nats, perplexity {math.exp(ours_loss):.0f} "
              f"vs {math.exp(base_loss):.0f}")
    r4 = lambda x: None if x is None else round(x, 4)  # noqa: E731
    out = {"tpu_ray_test_loss": r4(ours_loss), "reference_test_loss": ref_loss and round(ref_loss, 4),
           "baseline_loss": round(base_loss, 4), "tpu_ray_top1": r4(ours_top1),
           "reference_top1": ref_top1 and round(ref_top1, 4), "baseline_top1": round(base_top1, 4),
           "tpu_ray_seconds": ours_s and round(ours_s, 1), "reference_seconds": ref_s and round(ref_s, 1),
           "steps": args.steps, "masked_test_tokens": n,
           "time_to_reference_seconds": reach and round(reach, 1), "time_to_reference_ratio": ratio and round(ratio, 3),
           "time_to_reference_ratio_vs_wall": ratio_wall and round(ratio_wall, 3),
           "steps_to_reference": reach_steps and round(reach_steps),
           "steps_to_reference_ratio": reach_steps and round(reach_steps / args.steps, 3),
           "tpu_ray_overrides": args.set, "tpu_ray_curve": ours_curve, "reference_curve": ref_curve, "mask_prob": args.mask_prob,
           "mask_count": args.mask_count,
           "jit_compile": args.jit}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
