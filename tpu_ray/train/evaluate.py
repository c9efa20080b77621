"""`tpu-ray eval`: a run's latest checkpoint evaluated on its validation shards, recorded as `eval_rerun`
(what is computed and written: train/evaluation.py, the trainer's own evaluation path)."""

from __future__ import annotations

from typing import Any

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError

RERUN_KIND = "eval_rerun"  # `tpu-ray eval` records: never mixed with the training curve's `eval`
IDENTITY = ("corpus", "tokenizer", "shard", "model", "eval")  # the fingerprint's sections that make the figure the run's


def evaluate_run(cfg: RunConfig) -> dict:
    """The evaluation's one reader of the whole config (as train/loop.train is the trainer's): it
    resolves the run into what the trainer's build and evaluator take, and runs them."""
    from tpu_ray.train.metrics import MetricsWriter
    from tpu_ray.prepare.shard_set import ShardSet
    from tpu_ray.train.strategy import keeps_global_policy, select
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.loop import build, checkpoint_store, evaluator, mask_spec

    paths = cfg.paths
    with keeps_global_policy():  # the caller's process keeps its precision
        tok = tokenizer_info(paths.tokenizer_dir)
        shards = ShardSet.open(paths.shards_dir)
        shards.require_complete()
        shards.require_made_with(tok, paths.seq_len, paths.tokenizer_dir)
        shards.verify(splits=("validation",))  # what eval reads, as training checks it before it starts
        info = select(cfg.train)
        model_spec = cfg.model_spec
        s = build(cfg.train, paths, cfg.seed, model_spec, info, tok)
        with checkpoint_store(s, write=False) as ckpts:
            if not ckpts.present:
                raise UserError(f"{ckpts.directory}: no checkpoint to evaluate; train first (tpu-ray train)")
            ckpts.restore(s.checkpoint, partial=True)
        evaluate = evaluator(s, shards, cfg.train.batch_size // info.replicas, mask_spec(cfg.train, paths, tok),
                             cfg.eval, paths.seq_len)
        if evaluate is None:
            raise UserError(f"{paths.shards_dir}: no validation samples to evaluate on")
        with shards.naming_corrupt_files():
            result = evaluate(int(s.step_var.numpy()))
        # A rerun is its own kind: the training curve (kind eval) is history and stays as it was.
        metrics = MetricsWriter(paths.run_dir, shared=cfg.ray.shared_filesystem)
        result.record(metrics, RERUN_KIND, RERUN_KIND, checkpoint=ckpts.latest_url)  # train/evaluation.py
        metrics.close()
        return result.as_dict()


def check_eval_config(fingerprint: dict[str, Any], run_dir: str) -> None:
    """Refuse, in one line, a config (its `fingerprint`, RunConfig.fingerprint) that differs from the
    saved one of the run at `run_dir` in what shapes the model or the evaluation set (the corpus,
    tokenizer, shard, model and eval sections): its figure would not be the run's. The rest (seed,
    batch size, device, strategy) may change: the weights come from the checkpoint and the set is
    fixed by the shards alone."""
    from tpu_ray.rundir import CONFIG_FILE
    from tpu_ray.saved_config import first_difference, read_saved_config

    saved = read_saved_config(run_dir)
    if saved is None:
        return
    diff = first_difference(identity(saved.fingerprint()), identity(fingerprint))
    if diff:
        raise UserError(f"{run_dir}: {diff}; that changes the model or the evaluation set the run was trained "
                        f"with, so its figure would not be the run's; evaluate with the saved config "
                        f"({CONFIG_FILE}), without that override")


def identity(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The sections of a config's fingerprint that make an evaluation's figure the run's."""
    return {k: v for k, v in fingerprint.items() if k in IDENTITY}
