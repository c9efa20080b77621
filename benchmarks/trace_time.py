"""Tracing the train step: transformers' model code run unconverted by autograph, against converted.

The trainer traces its step function once per span (and doctor, the evaluator and every
steps-per-execution variant trace theirs): time a user waits before the first step, and most of
what a short CPU run (or a test) spends. transformers' TF models branch on Python values, so
autograph's conversion of their code buys nothing; train/loop.mlm_logits calls the model under
`tf.autograph.experimental.do_not_convert` (families that need autograph excepted). Both sides here
build the same model and trace the same gradient step (forward through the gathered MLM head,
backward, per-replica sums); only the autograph setting differs. Rounds alternate the two, each in
a fresh process (autograph caches its conversions per process, as the trainer's first trace pays
them once), timing the step's first call (trace + one step) and its second (one step: the steady
state, which must not change).

    python benchmarks/trace_time.py [--types roberta,bert,deberta-v2] [--rounds 3]

Last line: {"trace_s": {type: unconverted}, "converted_trace_s": {...}, "speedup": {...},
"step_s": {...}, "converted_step_s": {...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEQ_LEN, BATCH, PREDICTIONS, VOCAB = 128, 16, 20, 8000
SIZES = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}


def _model(model_type: str):
    from transformers import AutoConfig, TFAutoModelForMaskedLM

    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, max_position_embeddings=SEQ_LEN + 2,
                                  pad_token_id=1, **SIZES)
    model = TFAutoModelForMaskedLM.from_config(config)
    model(model.dummy_inputs, training=False)
    return model


def _batch():
    import tensorflow as tf

    ids = tf.random.stateless_uniform([BATCH, SEQ_LEN], (1, 2), minval=5, maxval=VOCAB, dtype=tf.int32)
    positions = tf.tile(tf.range(PREDICTIONS)[None, :] * (SEQ_LEN // PREDICTIONS), [BATCH, 1])
    return {"input_ids": ids, "attention_mask": tf.ones_like(ids), "mlm_positions": positions,
            "mlm_labels": tf.gather(ids, positions, batch_dims=1)}


def _step(model, logits_fn):
    """The trainer's replica gradient step (train/loop.make_replica_grads' shape), with `logits_fn`."""
    import tensorflow as tf

    from tpu_ray.train.loop import masked_sums

    @tf.function
    def step(batch):
        with tf.GradientTape() as tape:
            loss_sum, _, count = masked_sums(batch["mlm_labels"], logits_fn(model, batch, training=True))
            loss = loss_sum / tf.maximum(count, 1.0)
        return loss, tape.gradient(loss, model.trainable_variables)

    return step


def _time(model, logits_fn, batch) -> tuple[float, float]:
    step = _step(model, logits_fn)
    t0 = time.perf_counter()
    step(batch)[0].numpy()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    step(batch)[0].numpy()
    return first, time.perf_counter() - t0


def _one(model_type: str, mode: str) -> None:
    """In a fresh process (autograph caches what it converted: a second trace in one process would
    not pay again, where the trainer's first trace of a run does): print {first, second} as JSON."""
    from tpu_ray.train.heads import gathered_logits
    from tpu_ray.train.loop import mlm_logits

    model = _model(model_type)
    first, second = _time(model, mlm_logits if mode == "unconverted" else gathered_logits, _batch())
    print(json.dumps({"first": first, "second": second}))


def main() -> None:
    import subprocess

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--types", default="roberta,bert,deberta-v2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", nargs=2, metavar=("TYPE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return _one(*args.one)

    out: dict[str, dict[str, float]] = {k: {} for k in ("trace_s", "converted_trace_s", "speedup", "step_s",
                                                          "converted_step_s")}
    print(f"{'type':<12} {'unconverted trace':>18} {'converted trace':>16} {'ratio':>6} {'step':>8} {'step conv.':>10}")
    for model_type in args.types.split(","):
        runs: dict[str, list[dict[str, float]]] = {"unconverted": [], "converted": []}
        for _ in range(args.rounds):  # alternated, each in a fresh process: the same machine load for both
            for mode in runs:
                done = subprocess.run([sys.executable, __file__, "--one", model_type, mode], capture_output=True,
                                      text=True, check=True)
                runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
        med = {k: (statistics.median(r["first"] for r in v), statistics.median(r["second"] for r in v))
               for k, v in runs.items()}
        ratio = med["converted"][0] / med["unconverted"][0]
        out["trace_s"][model_type], out["converted_trace_s"][model_type] = med["unconverted"][0], med["converted"][0]
        out["speedup"][model_type] = ratio
        out["step_s"][model_type], out["converted_step_s"][model_type] = med["unconverted"][1], med["converted"][1]
        print(f"{model_type:<12} {med['unconverted'][0]:>17.2f}s {med['converted'][0]:>15.2f}s {ratio:>5.2f}x "
              f"{med['unconverted'][1]:>7.3f}s {med['converted'][1]:>9.3f}s", flush=True)
    print(json.dumps({k: {t: round(x, 3) for t, x in v.items()} for k, v in out.items()}))


if __name__ == "__main__":
    main()
