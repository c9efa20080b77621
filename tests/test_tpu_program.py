"""The program a TPU runs, executed on CPU: several steps per execution on the user's grid, bfloat16
and float16 (loss-scaled) precision, and resume that ends with the weights of an uninterrupted run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.test_train import _cfg, _records, checkpoint_weights, max_abs_difference, shards_dir  # noqa: F401


@pytest.mark.quick
def test_hooks_grid_never_crosses_a_boundary():
    from tpu_ray.train.hooks import Call, Hooks, executions

    seen: dict[str, list[int]] = {"log": [], "ckpt": []}
    lengths: list[int] = []
    hooks = Hooks()
    hooks.add(Call("log", seen["log"].append), every=10)
    hooks.add(Call("ckpt", seen["ckpt"].append), every=25)

    def execute(n):
        lengths.append(n)
        return None, 0.0, 0.0

    steps = [i.step for i in executions(3, 57, 4, hooks, execute)]
    assert seen == {"log": [10, 20, 30, 40, 50, 57], "ckpt": [25, 50, 57]}
    assert max(lengths) == 4 and sum(lengths) == 54 and steps[-1] == 57
    assert all(not (a // 10 < (b - 1) // 10) for a, b in zip([3, *steps], steps))  # no execution crosses 10s


@pytest.mark.quick
def test_a_new_periodic_task_is_one_add_call_and_shapes_the_grid():
    """Hooks.add: a task added beside the trainer's own runs on its own grid (or several), in the
    order added, and on demand by name (force); a second hook of one name or a zero interval is refused."""
    from tpu_ray.train.hooks import Call, Hooks, executions

    calls: list[tuple[str, int]] = []
    hooks = Hooks()
    hooks.add(Call("log", lambda step: calls.append(("log", step))), every=10)
    hooks.add(Call("downstream", lambda step: calls.append(("downstream", step))), every=(15, 16), at_end=False)
    steps = [i.step for i in executions(0, 32, 8, hooks, lambda n: (None, 0.0, 0.0))]
    assert steps == [8, 10, 15, 16, 20, 28, 30, 32]  # no execution crosses a 10, a 15 or a 16
    assert calls == [("log", 10), ("downstream", 15), ("downstream", 16), ("log", 20), ("log", 30),
                     ("downstream", 30), ("log", 32), ("downstream", 32)]
    assert hooks.entry("downstream").every == (15, 16) and "eval" not in hooks
    hooks.force("downstream", 0)
    assert calls[-1] == ("downstream", 0)
    with pytest.raises(ValueError, match="'log' is already added"):
        hooks.add(Call("log", print), every=5)
    with pytest.raises(ValueError, match="every=0"):
        hooks.add(Call("upload", print), every=0)


def test_steps_per_execution_4_ends_where_1_ends_on_the_asked_grid(tmp_path, shards_dir, tiny_tokenizer_dir):  # noqa: F811
    """dropout 0: 4 steps per execution and 1 reach the same step with the same weights (< 1e-5) and
    the same metrics stream; with log_every=10 the records land at 10, 20, 30, 40 (not 12, 20, 32, 40)."""
    from tpu_ray.train.loop import train

    over = {"train.steps": 40, "train.log_every": 10, "train.eval_every": 20, "train.checkpoint_every": 20,
            "model.dropout": 0.0}
    runs = {}
    for spe in (1, 4):
        run_dir = tmp_path / f"spe{spe}"
        summary = train(_cfg(run_dir, shards_dir, tiny_tokenizer_dir, **over, **{"train.steps_per_execution": spe}))
        runs[spe] = (summary, _records(run_dir, "train"), _records(run_dir, "eval"), checkpoint_weights(run_dir))
    (s1, train1, eval1, w1), (s4, train4, eval4, w4) = runs[1], runs[4]
    assert s1["steps"] == s4["steps"] == 40 and s4["train_traces"] == 1
    assert [r["step"] for r in train4] == [r["step"] for r in train1] == [10, 20, 30, 40]
    assert [r["step"] for r in eval4] == [r["step"] for r in eval1] == [20, 40]
    assert max_abs_difference(w1, w4) < 1e-5
    assert [r["loss"] for r in train4] == pytest.approx([r["loss"] for r in train1], rel=1e-5)
    assert [r["eval_loss"] for r in eval4] == pytest.approx([r["eval_loss"] for r in eval1], rel=1e-6)
    assert all(r["input_wait_s"] is None for r in train4)  # NaN (null): not separable inside an execution


def test_mixed_bfloat16_trains_the_tiny_model_on_cpu(tmp_path, shards_dir, tiny_tokenizer_dir):  # noqa: F811
    """TPU precision on CPU: bfloat16 compute, float32 variables, logits cast to float32 for the loss."""
    import tensorflow as tf
    import tf_keras

    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.loop import build, masked_sums, mlm_logits, train
    from tpu_ray.train.strategy import select

    cfg = _cfg(tmp_path / "run", shards_dir, tiny_tokenizer_dir,
               **{"train.steps": 30, "train.log_every": 5, "train.eval_every": 30, "train.learning_rate": 2e-3,
                  "train.mixed_precision": "mixed_bfloat16"})
    try:
        summary = train(cfg)
        losses = [r["loss"] for r in _records(tmp_path / "run", "train")]
        assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
        assert math.isfinite(summary["eval_loss"])
        start = [e for e in _records(tmp_path / "run", "event") if e["event"] == "train_start"][-1]
        assert start["precision"] == "mixed_bfloat16" and start["evaluates"] is True  # it has validation samples
        for e in _records(tmp_path / "run", "eval"):  # timed by the trainer, within the run's own clock
            assert 0 < e["eval_time_s"] <= e["time"] - start["time"], e
        # The caller's process (the Python API's, a notebook's) gets its own policy back: else the
        # next model built there comes out in bfloat16.
        assert tf_keras.mixed_precision.global_policy().name == "float32"

        info = select(cfg.train)
        assert tf_keras.mixed_precision.global_policy().name == "mixed_bfloat16"
        s = build(cfg.train, cfg.paths, cfg.seed, cfg.model_spec, info, tokenizer_info(tiny_tokenizer_dir))
        assert {w.dtype for w in s.model.weights} == {tf.float32}
        ids = tf.fill([2, 64], 7)
        batch = {"input_ids": ids, "attention_mask": tf.ones_like(ids), "mlm_positions": tf.fill([2, 4], 3),
                 "mlm_labels": tf.fill([2, 4], 9)}
        logits = mlm_logits(s.model, batch, training=True)
        assert logits.dtype == tf.bfloat16
        loss_sum, _, count = masked_sums(batch["mlm_labels"], logits)
        assert loss_sum.dtype == tf.float32 and math.isfinite(float(loss_sum)) and float(count) == 8
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")


def test_float16_loss_scaling_takes_the_unscaled_float32_step(tmp_path, shards_dir, tiny_tokenizer_dir):  # noqa: F811
    """The GPU path (mixed_float16 + LossScaleOptimizer), forced on CPU, against an unscaled float32
    step from the same weights on the same batch: the gradients and Adam's first moments (which,
    unlike Adam's update, scale with the gradients) agree within float16's precision. Without the
    unscaling they would be ~loss-scale (32768) times larger; weights merely moving would not see it."""
    import tensorflow as tf
    import tf_keras

    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.inputs import IGNORE, train_dataset
    from tpu_ray.train.loop import build, make_replica_grads, make_train_step, mask_spec
    from tpu_ray.train.strategy import StrategyInfo

    cfg = _cfg(tmp_path / "run", shards_dir, tiny_tokenizer_dir, **{"train.learning_rate": 1e-3, "model.dropout": 0.0})
    tok = tokenizer_info(tiny_tokenizer_dir)
    files = sorted(str(p) for p in shards_dir.glob("train-*.tfrecord"))
    batch = next(iter(train_dataset(files, cfg.shard.seq_len, 16, mask_spec(cfg.train, cfg.paths, tok), cfg.seed, 64)))
    count = tf.reduce_sum(tf.cast(tf.not_equal(batch["mlm_labels"], IGNORE), tf.float32))
    runs = {}
    for precision, kind in (("float32", "cpu"), ("mixed_float16", "gpu")):
        tf_keras.mixed_precision.set_global_policy(precision)
        try:
            s = build(cfg.train, cfg.paths, cfg.seed, cfg.model_spec, StrategyInfo(tf.distribute.get_strategy(), kind, 1, "cpu", precision, False, 1), tok)
            grads = [tf.convert_to_tensor(g).numpy() for g in make_replica_grads(s)(batch, count)[0]]
            sums = make_train_step(s)[0](batch).numpy()
            adam = getattr(s.optimizer, "inner_optimizer", s.optimizer)
            first_moments = [adam.get_slot(v, "m").numpy() for v in s.model.trainable_variables]
            runs[precision] = (s, grads, sums, first_moments)
        finally:
            tf_keras.mixed_precision.set_global_policy("float32")
    (_, g32, sums32, m32), (s16, g16, sums16, m16) = runs["float32"], runs["mixed_float16"]
    assert isinstance(s16.optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
    assert float(s16.optimizer.loss_scale) >= 1024  # so a missing unscaling could not hide in the tolerance
    assert {w.dtype for w in s16.model.weights} == {tf.float32}
    assert np.isfinite(sums16).all() and sums16[0] == pytest.approx(sums32[0], rel=1e-2)

    def relative(a: list, b: list) -> float:
        return max(float(np.abs(x - y).max()) for x, y in zip(a, b)) / max(float(np.abs(y).max()) for y in b)

    assert relative(g16, g32) < 0.05, relative(g16, g32)
    assert relative(m16, m32) < 0.05, relative(m16, m32)
    assert int(s16.optimizer.iterations.numpy()) == 1




@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_the_trainers_step_compiled_with_xla_equals_the_uncompiled_step(tmp_path, shards_dir, tiny_tokenizer_dir):  # noqa: F811
    """A TPU always compiles the step with XLA; the CPU defaults never did, so only doctor's probe
    was ever compiled. Here the trainer's own step (make_train_step), one step per call in float32
    and 4 steps per execution in mixed_bfloat16, runs with jit_compile=True and ends with the
    weights of the uncompiled step on the same batches (within each precision's tolerance)."""
    import tensorflow as tf
    import tf_keras

    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.inputs import train_dataset
    from tpu_ray.train.loop import build, make_train_step, mask_spec
    from tpu_ray.train.strategy import StrategyInfo

    cfg = _cfg(tmp_path / "run", shards_dir, tiny_tokenizer_dir, **{"model.dropout": 0.0})
    tok = tokenizer_info(tiny_tokenizer_dir)
    files = sorted(str(p) for p in shards_dir.glob("train-*.tfrecord"))

    def weights_after(precision: str, jit: bool, spe: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        tf_keras.mixed_precision.set_global_policy(precision)
        try:
            s = build(cfg.train, cfg.paths, cfg.seed, cfg.model_spec, StrategyInfo(tf.distribute.get_strategy(), "cpu", 1, "cpu", precision, jit, spe), tok)
            before = [w.numpy() for w in s.model.trainable_weights]
            step, steps = make_train_step(s)
            batches = iter(train_dataset(files, cfg.shard.seq_len, 16, mask_spec(cfg.train, cfg.paths, tok), cfg.seed, 64))
            if spe == 1:
                for _ in range(4):
                    step(next(batches))
            else:
                steps(batches, tf.constant(spe))
            assert int(s.optimizer.iterations.numpy()) == 4
            return before, [w.numpy() for w in s.model.trainable_weights]
        finally:
            tf_keras.mixed_precision.set_global_policy("float32")

    def largest(a: list[np.ndarray], b: list[np.ndarray]) -> float:
        return max(float(np.abs(x - y).max()) for x, y in zip(a, b))

    def norm(a: list[np.ndarray], b: list[np.ndarray]) -> float:
        return float(np.sqrt(sum(float(np.sum((x.astype(np.float64) - y) ** 2)) for x, y in zip(a, b))))

    # float32 one step per call: XLA's float32 is the plain float32 to rounding (measured ~7e-7);
    # bfloat16, 4 steps per execution (the TPU program's shape): measured ~0.013.
    for precision, spe, tolerance in (("float32", 1, 1e-4), ("mixed_bfloat16", 4, 0.05)):
        (start, plain), (start_jit, compiled) = weights_after(precision, False, spe), weights_after(precision, True, spe)
        assert largest(start, start_jit) == 0  # the same initial weights (the seed)
        # The update the 4 steps made, and how far the compiled run's weights are from the plain run's
        # (whole-model L2: in bfloat16, Adam's ~lr*sign(g) update flips on a few near-zero gradients).
        moved, differ = norm(plain, start), norm(compiled, plain)
        assert moved > 1e-2 and differ <= tolerance * moved, (precision, spe, moved, differ)

