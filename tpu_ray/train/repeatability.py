"""What a run can promise about repeating itself, by accelerator: one sentence each, shared by
`tpu-ray doctor` and the model card so the two never disagree.

Why these words: on a CPU the promise is measured and tested (tests/test_repeatability.py: the same
config and seed give the same losses, evaluation figures and exported weights to the last bit, under
load, with 1 or 3 shard actors, straight or stopped and resumed). Elsewhere it is what TensorFlow and
XLA document, no more: `tf.config.experimental.enable_op_determinism()` (which replaced
TF_DETERMINISTIC_OPS in TF 2.8) promises the same outputs for the same inputs on the same hardware,
and is what GPUs need (their default kernels may add in a different order on each run); tpu-ray does
not turn it on. Neither TensorFlow nor XLA documents a determinism promise for TPUs. A tokenizer the
run trains repeats too: `tokenizers`' Unigram and WordPiece trainers walk the words in a hash order
seeded anew in each process, and tpu_ray/prepare/tokenizer.py takes that out (canonical_unigram,
deterministic_wordpiece); a Unigram score is kept to 6 decimals, and its last-bit noise may straddle
one: rare, measured on WikiText-2 at 8,000 pieces as about once in 8,000 trainings, not measured
on every kind of text (tests/test_tokenizer.py: two processes, every kind). No promise holds
across TensorFlow versions or processors: another CPU's kernels may round differently, and 2,000
steps grow a last-bit difference into a different third decimal.
"""

from __future__ import annotations

GUARANTEE = {
    "cpu": "bit for bit on one software stack (the same TensorFlow, Python and CPU kind): the same config "
           "and seed give the same losses, evaluation figures and weights, under load, with any number of "
           "shard actors, straight or resumed, the tokenizer the run trains included (tested; a Unigram score, "
           "kept to 6 decimals, may rarely round one step apart: about once in 8,000 trainings on WikiText-2); "
           "another CPU or "
           "TensorFlow version may round differently",
    "gpu": "not promised: TensorFlow repeats GPU runs only with tf.config.experimental.enable_op_determinism(), "
           "which tpu-ray does not turn on; expect the same curve, not the same digits",
    "tpu": "not promised: neither TensorFlow nor XLA documents run-to-run determinism on TPUs, and tpu-ray has "
           "not measured it; expect the same curve, not the same digits",
}


def guarantee(kind: str) -> str:
    """The repeatability promise of a run on `kind` (cpu, gpu or tpu; anything else is treated as cpu)."""
    return GUARANTEE.get(kind, GUARANTEE["cpu"])
