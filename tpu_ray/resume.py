"""What a run directory's checkpoints say about starting or resuming, read without TensorFlow.

The trainer refuses a run directory with checkpoints unless `--resume`, but only after Ray and
TensorFlow have started (seconds). These checks read TF's `checkpoint` state file as text, so a
command can refuse at once, and an interrupted command can say where the last checkpoint is.
It reads the run directory only (no config, no training code): the trainer and the stages above
it all ask it, so it sits with `rundir` at the foundations.
"""

from __future__ import annotations

import re
import shlex

from tpu_ray import rundir, storage
from tpu_ray.errors import UserError

_STEP = re.compile(r"ckpt-(\d+)$")


def latest_checkpoint(run_dir: str) -> tuple[str, int | None] | None:
    """(path of the latest committed checkpoint, its step) of `run_dir`, or None if it has none."""
    state = rundir.path(rundir.checkpoints_dir(run_dir), rundir.CHECKPOINT_STATE_FILE)
    try:
        if not storage.exists(state):
            return None
        name = rundir.latest_named(storage.read_text(state))
    except (OSError, storage.StorageError, UnicodeDecodeError):
        return None
    if not name:
        return None
    step = _STEP.search(name)
    return rundir.path(rundir.checkpoints_dir(run_dir), name), (int(step.group(1)) if step else None)


def refuse_existing_run(run_dir: str, resume: bool) -> None:
    """Raise the trainer's own refusal before any slow start-up: checkpoints there, no --resume."""
    if resume:
        return
    found = latest_checkpoint(run_dir)
    if found:
        raise UserError(f"{rundir.checkpoints_dir(run_dir)}: this run directory already has "
                        f"checkpoints (latest {found[0]}); pass --resume to continue it or use a new "
                        f"--output-dir")


def interrupted_message(run_dir: str, argv: list[str]) -> str:
    """What to tell a user who pressed Ctrl-C: where the last checkpoint is and the command that
    continues from it (the same command line with --resume)."""
    found = latest_checkpoint(run_dir)
    if not found:
        return f"tpu-ray: interrupted; no checkpoint was written yet in {run_dir}"
    path, step = found
    args = list(argv) + ([] if "--resume" in argv else ["--resume"])
    at = f" (step {step})" if step is not None else ""
    return (f"tpu-ray: interrupted; last checkpoint {path}{at}. Continue with:\n"
            f"  tpu-ray {shlex.join(args)}")
