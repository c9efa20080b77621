"""`tpu-ray eval`: a run's latest checkpoint evaluated on its validation shards, recorded as `eval_rerun`
(what is computed and written: train/evaluation.py, the trainer's own evaluation path)."""

from __future__ import annotations

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError

RERUN_KIND = "eval_rerun"  # `tpu-ray eval` records: never mixed with the training curve's `eval`


def evaluate_run(cfg: RunConfig) -> dict:
    from tpu_ray.train.strategy import keeps_global_policy

    with keeps_global_policy():  # the caller's process keeps its precision
        return _evaluate_run(cfg)


def _evaluate_run(cfg: RunConfig) -> dict:
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
    evaluate = evaluator(cfg, s, shards, cfg.train.batch_size // info.replicas)
    if evaluate is None:
        raise UserError(f"{cfg.shards_dir}: no validation samples to evaluate on")
    with shards.naming_corrupt_files():
        result = evaluate(int(s.step_var.numpy()))
    # A rerun is its own kind: the training curve (kind eval) is history and stays as it was.
    metrics = MetricsWriter(cfg.run_dir, shared=cfg.ray.shared_filesystem)
    result.record(metrics, RERUN_KIND, RERUN_KIND, checkpoint=ckpts.latest_url)  # train/evaluation.py
    metrics.close()
    return result.as_dict()


def check_eval_config(cfg: RunConfig) -> None:
    """Refuse, in one line, a config that differs from the run's saved one in what shapes the model or
    the evaluation set (the corpus, tokenizer, shard, model and eval sections of the fingerprint):
    its figure would not be the run's. The rest (seed, batch size, device, strategy) may change: the
    weights come from the checkpoint and the set is fixed by the shards alone."""
    from tpu_ray.rundir import CONFIG_FILE
    from tpu_ray.saved_config import first_difference, read_saved_config

    saved = read_saved_config(cfg.run_dir)
    if saved is None:
        return

    def identity(c: RunConfig) -> dict:
        return {k: v for k, v in c.fingerprint().items() if k in ("corpus", "tokenizer", "shard", "model", "eval")}

    diff = first_difference(identity(saved), identity(cfg))
    if diff:
        raise UserError(f"{cfg.run_dir}: {diff}; that changes the model or the evaluation set the run was trained "
                        f"with, so its figure would not be the run's; evaluate with the saved config "
                        f"({CONFIG_FILE}), without that override")
