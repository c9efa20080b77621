"""Evaluate a run's latest checkpoint on its validation shards (loss, masked accuracy, perplexity)."""

from __future__ import annotations

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError


def evaluate_run(cfg: RunConfig) -> dict:
    from tpu_ray.train.metrics import MetricsWriter
    from tpu_ray.prepare.shard_set import ShardSet
    from tpu_ray.train.strategy import select
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.loop import evaluator, build, checkpoint_store

    tok = tokenizer_info(cfg.tokenizer_dir)
    shards = ShardSet.open(cfg.shards_dir)
    shards.require_complete()
    shards.require_made_with(tok, cfg.shard.seq_len, cfg.tokenizer_dir)
    shards.verify(splits=("validation",))  # what eval reads, as training checks it before it starts
    info = select(cfg.train)
    s = build(cfg, info, tok)
    with checkpoint_store(s, write=False) as ckpts:
        if not ckpts.present:
            raise UserError(f"{ckpts.directory}: no checkpoint to evaluate; train first (tpu-ray train)")
        ckpts.restore(s.checkpoint, partial=True)
    evaluate = evaluator(s, shards, cfg.train.batch_size // info.replicas)
    if evaluate is None:
        raise UserError(f"{cfg.shards_dir}: no validation samples to evaluate on")
    with shards.naming_corrupt_files():
        result = {"step": int(s.step_var.numpy()), **evaluate()}
    metrics = MetricsWriter(cfg.run_dir)
    for name, fields in result.get("sources", {}).items():
        metrics.write("eval_source", step=result["step"], source=name, **fields)
    metrics.write("eval", **{k: v for k, v in result.items() if k != "sources"})
    metrics.close()
    return result
