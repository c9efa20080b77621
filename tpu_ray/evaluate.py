"""Evaluate a run's latest checkpoint on its validation shards (loss, masked accuracy, perplexity)."""

from __future__ import annotations

from tpu_ray import storage
from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError


def evaluate_run(cfg: RunConfig) -> dict:
    from tpu_ray.metrics import MetricsWriter
    from tpu_ray.shards import shard_files
    from tpu_ray.strategy import select
    from tpu_ray.tokenizer import tokenizer_info
    from tpu_ray.train import _evaluator, build

    tok = tokenizer_info(cfg.tokenizer_dir)
    info = select(cfg.train)
    ckpt_dir = storage.join(cfg.run_dir, "checkpoints")
    s = build(cfg, info, tok, ckpt_dir)
    if not s.manager.latest_checkpoint:
        raise UserError(f"{ckpt_dir}: no checkpoint to evaluate; train first (tpu-ray train)")
    s.checkpoint.restore(s.manager.latest_checkpoint).expect_partial()
    evaluate = _evaluator(s, shard_files(cfg.shards_dir, "validation"), cfg.train.batch_size // info.replicas)
    if evaluate is None:
        raise UserError(f"{cfg.shards_dir}: too few validation samples for one batch of {cfg.train.batch_size}")
    result = {"step": int(s.step_var.numpy()), **evaluate()}
    MetricsWriter(cfg.run_dir).write("eval", **result)
    return result
