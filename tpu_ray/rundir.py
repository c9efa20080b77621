"""The run directory's layout: the one owner of its file and directory names.

    RUN/config.yaml  run_info.json  metrics.jsonl (metrics/ on gs:// and shared mounts)  summary.json  .lock
    RUN/tokenizer/tokenizer.json    RUN/shards/manifest.json    RUN/checkpoints/ckpt-N.*
    RUN/model/  RUN/tensorboard/  RUN/workers/  RUN/ray_train/
    RUN/init/source.json + files: the copy of model.init_from a continued run reads after its first stage
    RUN/downstream/step-N/model/: the model at step N that eval.downstream fine-tunes while training goes on

Which saved config a directory belongs to is saved_config.py's job.
"""

from __future__ import annotations

import re

from tpu_ray import storage
from tpu_ray.errors import UserError

CONFIG_FILE = "config.yaml"
RUN_INFO_FILE = "run_info.json"
METRICS_FILE = "metrics.jsonl"
METRICS_DIR = "metrics"  # gs:// and shared runs: one file per metrics writer (see metrics_stream.py)
SUMMARY_FILE = "summary.json"
LOCK_FILE = ".lock"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILE = "tokenizer.json"
SHARDS_DIR = "shards"
MANIFEST_FILE = "manifest.json"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_STATE_FILE = "checkpoint"  # TensorFlow's name for the file listing the checkpoints
MODEL_DIR = "model"
TENSORBOARD_DIR = "tensorboard"
WORKERS_DIR = "workers"
RAY_TRAIN_DIR = "ray_train"
INIT_DIR = "init"  # a continued run's own copy of its model.init_from (train/init_from.py)
INIT_RECORD_FILE = "source.json"  # written last: the copy is complete once it exists
DOWNSTREAM_DIR = "downstream"  # eval.downstream's snapshots: step-<N>/model (config.json written last)
PROVENANCE_KEY = "tpu_ray_export"  # in an export's config.json (train/export.py): what and when it was made from


def snapshot_dir(run_dir: str, step: int) -> str:
    """Where the model at `step` is written for eval.downstream (the directory holds `model/`)."""
    return path(run_dir, DOWNSTREAM_DIR, f"step-{step:08d}")


def snapshot_step(name: str) -> int | None:
    """The step of a snapshot directory's name (`step-00000020` -> 20); None for anything else."""
    m = re.fullmatch(r"step-(\d{8,})", name.rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None

_CKPT_FILE = re.compile(r"^ckpt-\d+\.(index|data-\d+-of-\d+)$")


def path(run_dir: str, *names: str) -> str:
    """A file or directory of the run: `path(run_dir, CONFIG_FILE)`."""
    return storage.join(run_dir, *names)


def checkpoints_dir(run_dir: str) -> str:
    return path(run_dir, CHECKPOINTS_DIR)


def checkpoint_files(run_dir: str) -> list[str]:
    """Names of the `ckpt-*` files and TF's state file in the run's checkpoint directory."""
    directory = checkpoints_dir(run_dir)
    if not storage.exists(directory):
        return []
    names = (p.rstrip("/").rsplit("/", 1)[-1] for p in storage.listdir(directory))
    return sorted(n for n in names if _CKPT_FILE.match(n) or n == CHECKPOINT_STATE_FILE)


_LATEST = re.compile(r'^model_checkpoint_path:\s*"([^"]+)"', re.M)


def latest_named(state_text: str | None) -> str | None:
    """The checkpoint TF's state file names as the latest (its base name, e.g. `ckpt-20`), read as
    text: no TensorFlow needed (resume checks run before it is imported)."""
    match = _LATEST.search(state_text or "")
    return match.group(1).replace("\\", "/").rsplit("/", 1)[-1] if match else None


def refuse_misplaced_files(output_dir: str | None, shards_dir: str | None, tokenizer_path: str | None) -> None:
    """Refuse, before anything is written, a local file where a run's directory belongs (and a
    configured tokenizer that is not a directory): one line naming the config key, not an OSError
    from deep inside a stage after the config was already saved."""
    import os

    for key, value in (("output_dir", output_dir), ("shard.dir", shards_dir), ("tokenizer.path", tokenizer_path)):
        if value and not storage.is_remote(value) and os.path.isfile(value):
            raise UserError(f"{key}={value}: a file is in the way (not a directory); remove it or choose "
                            f"another path")
    if tokenizer_path and not storage.is_remote(tokenizer_path) and not os.path.isdir(tokenizer_path):
        raise UserError(f"tokenizer.path={tokenizer_path}: no such directory; pass a tokenizer directory "
                        f"(with {TOKENIZER_FILE}), or leave tokenizer.path out to train one")
