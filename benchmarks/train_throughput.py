"""Training throughput on CPU: tpu-ray's trainer against the reference workflow's `model.fit` loop.

Same model (RoBERTa: hidden 256, 4 layers, 4 heads, intermediate 1024), same shards (WikiText-2,
seq_len 128), same global batch (32), float32, no XLA on either side. The two are alternated
`--rounds` times in one process and the medians of the steady-state step times are compared (the
first `--warmup` steps of every round, which include tracing, are left out). The input pipeline
is also timed alone (batches/s with no model) to show how far it is from being the bottleneck.

    python benchmarks/train_throughput.py            # prints a table, then one JSON line

Last line: {"samples_per_s", "reference_samples_per_s", "vs_reference", "input_headroom", "train_traces"}.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext-2"

SEQ_LEN, BATCH = 128, 32
MODEL = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}


def prepare(work: Path, vocab: int) -> "object":
    """Tokenizer + shards from WikiText-2 with tpu-ray's own stages (in-process, no Ray needed)."""
    from tokenizers import Tokenizer

    from tpu_ray.config import RunConfig
    from tpu_ray.prepare.corpus import plan_units
    from tpu_ray.pipeline import shard_job
    from tpu_ray.prepare.shards import process_unit, shard_set
    from tpu_ray.prepare.tokenizer import describe, save_tokenizer, train_tokenizer

    corpus = work / "wikitext-2.txt"
    corpus.write_bytes(b"".join((WIKITEXT / n).read_bytes() for n in ("valid.txt", "test.txt")))
    cfg = RunConfig.from_dict({
        "name": "bench", "output_dir": str(work / "run"), "corpus": {"source": str(corpus)},
        "tokenizer": {"vocab_size": vocab, "path": str(work / "tokenizer")},
        "shard": {"seq_len": SEQ_LEN, "unit_bytes": 131072, "dir": str(work / "shards")}, "model": MODEL,
        "train": {"batch_size": BATCH, "learning_rate": 1e-4, "warmup_steps": 0, "eval_every": 10**6,
                  "checkpoint_every": 10**6, "log_every": 1, "shuffle_buffer": 2048},
        "eval": {"samples": BATCH},
    })
    lines = [s for s in corpus.read_text().splitlines() if s.strip()]
    info = save_tokenizer(train_tokenizer([lines], cfg.tokenizer), str(work / "tokenizer"), SEQ_LEN)
    tok = Tokenizer.from_file(str(work / "tokenizer" / "tokenizer.json"))
    units = plan_units(cfg.corpus, cfg.shard, cfg.run_dir)
    os.makedirs(cfg.shards_dir, exist_ok=True)
    results = {u.index: process_unit(u, tok, info, SEQ_LEN, cfg.shards_dir) for u in units}
    shard_set(shard_job(cfg), describe(tok.to_str(), "bench"), units, results, complete=True).write()
    return cfg


def reference_round(cfg, steps: int, warmup: int) -> list[float]:
    """The reference loop for `steps` steps at lr 1e-4 without warm-up; returns steady step times."""
    return reference_fit(cfg, steps, lr=1e-4, warmup_steps=0)[1][warmup:]


def reference_fit(cfg, steps: int, lr: float, warmup_steps: int, seq_len: int = SEQ_LEN,
                  batch: int = BATCH, callbacks: list | None = None) -> tuple:
    """The reference workflow: TFRecordDataset -> parse -> shuffle -> batch -> the transformers
    collator's tf_mask_tokens -> model.fit with create_optimizer. Returns (model, step times)."""
    import tensorflow as tf
    import tf_keras
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling, TFAutoModelForMaskedLM, create_optimizer

    from tpu_ray.train.model import ModelSpec, hf_config
    from tpu_ray.prepare.shard_set import ShardSet
    from tpu_ray.prepare.tokenizer import tokenizer_info

    SEQ_LEN, BATCH = seq_len, batch  # noqa: N806 (the module's constants, overridable here)
    # The run's seed, as tpu-ray's trainer sets it, before anything random is built: both sides
    # start from the same initial weights, and the reference's shuffle and masks are repeatable.
    tf_keras.utils.set_random_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer_dir)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, return_tensors="tf")
    files = [p for p, _ in ShardSet.open(cfg.shards_dir).files("train")]

    def decode(example):
        spec = {k: tf.io.FixedLenFeature([SEQ_LEN], tf.int64) for k in ("input_ids", "attention_mask")}
        return tf.io.parse_single_example(example, spec)

    def mask(batch):
        special = (~tf.cast(batch["attention_mask"], tf.bool) | (batch["input_ids"] == tokenizer.cls_token_id)
                   | (batch["input_ids"] == tokenizer.sep_token_id))
        batch["input_ids"], batch["labels"] = collator.tf_mask_tokens(
            batch["input_ids"], vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id,
            special_tokens_mask=special)
        return batch

    ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files))
    ds = tf.data.TFRecordDataset(ds, num_parallel_reads=tf.data.AUTOTUNE).map(decode).shuffle(2048)
    ds = ds.repeat().batch(BATCH, drop_remainder=True).map(mask).prefetch(tf.data.AUTOTUNE)
    spec = ModelSpec(cfg.model, cfg.max_positions(), cfg.shard.seq_len, cfg.tokenizer_dir)  # from scratch
    model = TFAutoModelForMaskedLM.from_config(hf_config(spec, tokenizer_info(cfg.tokenizer_dir)))
    optimizer, _ = create_optimizer(init_lr=lr, num_train_steps=steps, num_warmup_steps=warmup_steps,
                                    weight_decay_rate=0.01)
    model.compile(optimizer=optimizer, metrics=["accuracy"])

    class Timer(tf_keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []

        def on_train_batch_begin(self, batch, logs=None):
            self._t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self._t)

    timer = Timer()
    model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[timer, *(callbacks or [])])
    return model, timer.times


def tpu_ray_round(cfg, steps: int, warmup: int, work: Path, i: int, jit: bool = False) -> tuple[list[float], int]:
    """tpu-ray's trainer on the same shards; step times from its own metrics stream."""
    from tpu_ray.train.loop import train

    out = work / f"ours-{i}{'-jit' if jit else ''}"
    run = cfg.override({"output_dir": str(out), "train.steps": steps, "train.jit_compile": jit})
    summary = train(run)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time_s"] for r in records if r["kind"] == "train"]
    return times[warmup:], summary["train_traces"]


def input_batches_per_s(cfg, batches: int = 300) -> float:
    """The masked input pipeline alone, as the trainer builds it."""
    from tpu_ray.train.inputs import train_dataset
    from tpu_ray.prepare.shard_set import ShardSet
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.loop import mask_spec

    files = [p for p, _ in ShardSet.open(cfg.shards_dir).files("train")]
    ds = train_dataset(files, SEQ_LEN, BATCH, mask_spec(cfg.train, cfg.paths, tokenizer_info(cfg.tokenizer_dir)), 0, 2048)
    it = iter(ds)
    for _ in range(20):
        next(it)
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches / (time.perf_counter() - t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=14, help="steps per round (each side)")
    p.add_argument("--warmup", type=int, default=4, help="steps per round left out (tracing, warm-up)")
    p.add_argument("--rounds", type=int, default=3, help="alternations of reference and tpu-ray")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--jit", action="store_true", help="also time tpu-ray with train.jit_compile=true (XLA on CPU)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="train-bench-") as tmp:
        work = Path(tmp)
        cfg = prepare(work, args.vocab)
        ref_times: list[float] = []
        our_times: list[float] = []
        jit_times: list[float] = []
        traces = []
        for i in range(args.rounds):
            ref_times += reference_round(cfg, args.steps, args.warmup)
            times, tr = tpu_ray_round(cfg, args.steps, args.warmup, work, i)
            our_times += times
            traces.append(tr)
            if args.jit:
                jit_times += tpu_ray_round(cfg, args.steps, args.warmup, work, i, jit=True)[0]
        input_bps = input_batches_per_s(cfg)

    ref_step, our_step = statistics.median(ref_times), statistics.median(our_times)
    ours_sps, ref_sps = BATCH / our_step, BATCH / ref_step
    rows = [
        ("reference model.fit (median step)", f"{ref_step * 1e3:8.1f} ms", f"{ref_sps:8.1f} samples/s"),
        ("tpu-ray trainer (median step)", f"{our_step * 1e3:8.1f} ms", f"{ours_sps:8.1f} samples/s"),
        ("input pipeline alone", f"{1e3 / input_bps:8.2f} ms", f"{input_bps * BATCH:8.1f} samples/s"),
    ]
    if jit_times:
        jit_step = statistics.median(jit_times)
        rows.append(("tpu-ray trainer, jit_compile=true", f"{jit_step * 1e3:8.1f} ms",
                     f"{BATCH / jit_step:8.1f} samples/s ({our_step / jit_step:.2f}x of jit off)"))
    print(f"model {MODEL} seq_len {SEQ_LEN} batch {BATCH}; {args.rounds} rounds x {args.steps} steps, "
          f"first {args.warmup} of each left out")
    for name, a, b in rows:
        print(f"  {name:36s} {a}  {b}")
    print(f"  vs_reference {ours_sps / ref_sps:.2f}x, input headroom {input_bps * our_step:.1f}x, "
          f"train traces per run {traces}")
    print(json.dumps({"samples_per_s": round(ours_sps, 2), "reference_samples_per_s": round(ref_sps, 2),
                      "vs_reference": round(ours_sps / ref_sps, 3),
                      "input_headroom": round(input_bps * our_step, 1), "train_traces": max(traces)}))


if __name__ == "__main__":
    main()
