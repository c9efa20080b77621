"""MultiWorkerMirroredStrategy across Ray workers, through Ray Train's `TensorflowTrainer`.

Ray Train fits this case exactly: it starts `train.workers` worker actors, gives each a
`TF_CONFIG` naming all of them, and runs the same function in each. Every worker runs
`tpu_ray.train.loop.train`; the strategy reads `TF_CONFIG`, each worker's input pipeline reads its own
shard files (`InputContext`), and only the chief writes metrics, checkpoints and the export.
(Not for TPUs: TensorFlow drives a TPU slice from one client process, see placement.py.)

Losing a worker's node: `train_multiworker` is one attempt, run under the same recovery loop as
the TPU/GPU path (cluster/recovery.py: `run_with_recovery`, the pure policy `decide`, the same
`node_lost` / `resumed_after_failure` events), which resumes every worker from the chief's last
committed checkpoint. Ray Train's own `FailureConfig` retries are off (max_failures=0) on purpose:
in Ray 2.60 its failure policy is not pluggable (`create_failure_policy` always returns
DefaultFailurePolicy) and retries every worker-group error, bad input included, up to
max_failures times, while our kinds say a bad batch size fails the same way again. A worker whose
actor or node died is lost capacity (retried); a typed error of a worker keeps its kind.

Never in the user's process: `launch_multiworker` runs each attempt's `fit()` in a Ray task whose
worker process exits with it (`max_calls=1`), so Ray Train's TrainController is owned by that
process, not by the driver. A Ray 2.60 driver that had owned a TrainController could stop hearing
from every actor it started after the controller was collected (docs/testing.md): a recovery
retry's second `fit()`, a second `Pipeline.run()` in one notebook and a later stage's shard actors
never answered.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from tpu_ray import rundir, storage
from tpu_ray.config import RunConfig
from tpu_ray.errors import FailureKind, LostCapacity, UserError, classify, find_user_error
from tpu_ray.logs import setup_logging

log = logging.getLogger(__name__)

# What trains once placed: train(cfg, resume) -> summary (tpu_ray.train.launch.train_here): the one
# callee every placement hands the whole run to.
TrainFn = Callable[[RunConfig, bool], dict]


def _worker_loop(config: dict[str, Any]) -> None:
    """Runs in each Ray Train worker: train, then report what this worker read and ended with."""
    import ray.train

    os.environ.update(config["env"])  # before storage's first use, as in shards.ShardWorker
    setup_logging()
    cfg = RunConfig.from_dict(config["cfg"]).override({"train.strategy": "multiworker"})
    summary = config["train"](cfg, config["resume"])
    rank = ray.train.get_context().get_world_rank()
    record = {"rank": rank, "files_read": summary["files_read"], "weights_sha256": summary["weights_sha256"],
              "steps": summary["steps"]}
    storage.atomic_write_text(rundir.path(cfg.run_dir, rundir.WORKERS_DIR, f"worker-{rank}.json"),
                              json.dumps(record, indent=1) + "\n")
    ray.train.report({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})


def launch_multiworker(cfg: RunConfig, resume: bool, train: TrainFn) -> dict[str, Any]:
    """One multi-worker attempt (`train_multiworker`) in a Ray task and process of its own, on this
    process's node (the run directory and Ray Train's bookkeeping are where this process sees them);
    raises what the attempt raised: a typed error as itself, a lost launcher as Ray says."""
    import ray

    # One line before any process starts.
    _check_shared_run_dir(cfg.run_dir, cfg.train.workers, cfg.ray.shared_filesystem)
    options: dict[str, Any] = {"name": "tpu_ray.train_launcher"}
    node = _this_node()
    if node is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
    # max_calls=1: the process ends with the task, and with it what Ray Train left in it.
    task = ray.remote(num_cpus=0, max_retries=0, max_calls=1)(_launch_task).options(**options)
    ref = task.remote(cfg.model_dump(mode="json"), resume, train, storage.forwarded_env())
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        user_error = find_user_error(exc)
        if user_error is not None:
            raise user_error from None
        raise
    except BaseException:  # interrupted here (Ctrl-C): the workers go with the launcher's process
        try:
            ray.cancel(ref, force=True)
        except Exception as exc:  # the launcher has ended already
            log.debug("cancelling the training launcher: %s", exc)
        raise


def _this_node() -> str | None:
    import ray

    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # a Ray Client driver has no node of its own: any node with the run directory
        return None


def _launch_task(cfg_dict: dict[str, Any], resume: bool, train: TrainFn, env: dict[str, str]) -> dict[str, Any]:
    """Body of the launcher task: the driver's storage environment, then Ray Train's `fit()` on the
    whole run (`cfg_dict`, the run's config as JSON: what a Ray task is handed)."""
    os.environ.update(env)  # before storage's first use; this process ends with the task (max_calls=1)
    setup_logging()
    return train_multiworker(RunConfig.from_dict(cfg_dict), resume, train)


def train_multiworker(cfg: RunConfig, resume: bool, train: TrainFn) -> dict[str, Any]:
    """`train(cfg, resume)` on `train.workers` Ray workers (see placement.run_training for `train`);
    checks that they all ended with the same weights. Runs Ray Train's `fit()` in this process: call
    it through `launch_multiworker`, never in a user's process."""
    from ray.train import FailureConfig, ScalingConfig
    from ray.train import RunConfig as RayRunConfig
    from ray.train.tensorflow import TensorflowTrainer

    t = cfg.train
    _check_shared_run_dir(cfg.run_dir, t.workers, cfg.ray.shared_filesystem)
    use_gpu = bool(t.num_gpus)
    trainer = TensorflowTrainer(
        _worker_loop,
        train_loop_config={"cfg": cfg.model_dump(mode="json"), "resume": resume, "train": train,
                           "env": storage.forwarded_env()},
        scaling_config=ScalingConfig(num_workers=t.workers, use_gpu=use_gpu,
                                     resources_per_worker={"GPU": t.num_gpus} if use_gpu else {"CPU": 1}),
        # Retries are recovery.run_with_recovery's (see the module docstring), not Ray Train's.
        run_config=RayRunConfig(name=f"{cfg.name}-train", failure_config=FailureConfig(max_failures=0),
                                **_ray_train_storage(cfg.run_dir)),
    )
    log.info("training on %d Ray Train workers (MultiWorkerMirroredStrategy)", t.workers)
    try:
        result = trainer.fit()
    except Exception as exc:  # Ray Train wraps workers' failures (WorkerGroupError.worker_failures)
        failures = [exc, *getattr(exc, "worker_failures", {}).values()]
        user_error = next(filter(None, map(find_user_error, failures)), None)
        if user_error is not None:
            raise user_error from None
        lost = [f for f in failures[1:] if classify(f).kind is FailureKind.LOST_CAPACITY]
        if lost:
            raise LostCapacity(f"a multi-worker training worker went away ({classify(lost[0]).line})") from exc
        raise
    records = [json.loads(storage.read_text(rundir.path(cfg.run_dir, rundir.WORKERS_DIR, f"worker-{r}.json")))
               for r in range(t.workers)]
    digests = {r["weights_sha256"] for r in records}
    if len(digests) != 1:
        raise RuntimeError(f"multi-worker training diverged: {len(digests)} different final weights "
                           f"across {t.workers} workers")
    summary = dict(result.metrics or {})
    summary["workers"] = records
    return summary


def _check_shared_run_dir(run_dir: str, workers: int, shared_filesystem: bool) -> None:
    """Workers on several nodes must all see the run directory: the chief's checkpoints decide
    where every worker resumes, and each worker reports through it (`workers`: train.workers,
    `shared_filesystem`: ray.shared_filesystem)."""
    import ray

    if not ray.is_initialized():
        return  # Ray Train will start a local (one-node) cluster
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) > 1 and not storage.is_remote(run_dir) and not shared_filesystem:
        raise UserError(f"output_dir={run_dir!r}: train.workers={workers} on a {len(nodes)}-node "
                        f"Ray cluster needs a run directory every node can read; use gs://... or a shared mount "
                        f"given as a URL")


def _ray_train_storage(run_dir: str) -> dict[str, Any]:
    """Ray Train's own bookkeeping goes to `<run_dir>/ray_train`. On gs:// it goes through our fsspec
    filesystem (wrapped for pyarrow, which Ray Train writes with), so it uses the same credentials
    and endpoint as the rest of the run (the emulator in tests) and no temp dir is left behind."""
    path = rundir.path(run_dir, rundir.RAY_TRAIN_DIR)
    if not storage.is_remote(path):
        return {"storage_path": os.path.abspath(path)}
    import pyarrow.fs

    fs, stripped = storage.filesystem(path)
    return {"storage_path": stripped,
            "storage_filesystem": pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))}
