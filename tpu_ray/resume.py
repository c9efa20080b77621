"""What a run directory's checkpoints say about starting or resuming, read without TensorFlow.

The trainer refuses a run directory with checkpoints unless `--resume`, but only after Ray and
TensorFlow have started (seconds). These checks read TF's `checkpoint` state file as text, so a
command can refuse at once, and an interrupted command can say where the last checkpoint is.
It reads the run directory only (no config, no training code): the trainer and the stages above
it all ask it, so it sits with `rundir` at the foundations. So does `global_start`, where a continued
run's steps stand on the chain of runs before it: the trainer stamps it into each export and
`tpu-ray compare` draws by it, one reading for both.
"""

from __future__ import annotations

import json
import os
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


_LONGEST_CHAIN = 64  # runs continued from runs: past this many, a chain is taken to be a loop


def global_start(run_dir: str) -> int | None:
    """The global step `run_dir`'s step 0 stands at: a continued run (model.init_from) goes on from
    its checkpoint, so its local step s is global step start + s. Read from the run's own copy of
    its source (RUN/init, train/init_from.py), never from the source itself, which may have moved
    since: the start its copy recorded when it was made (source.json's `global_start`, `copy_start`
    while the source was there to read); for a copy made before that was recorded, what the copy
    holds (`copy_start`, its parent run followed while it is there: 0 for one that is gone, a lower
    bound). 0 for a source of no known step (a published model); None for a run with no copy (a
    fresh run, or a continued one before its first stage copied its source)."""
    return _start(run_dir, frozenset())


def copy_start(init: str, parent: str | None, seen: frozenset[str] = frozenset()) -> int:
    """The global step a copy of a source (`init`: RUN/init, or a copy being made) starts at: a
    run's checkpoint ckpt-N is N plus that run's own start (`parent`: the run it came from, None
    when not a run or gone); an export's provenance (`export_global_step`); else 0."""
    found = latest_checkpoint(init)  # a run's checkpoint, copied as RUN/init/checkpoints/ckpt-N
    if found and found[1] is not None:
        return found[1] + ((_start(parent, seen) or 0) if parent else 0)
    # A run's checkpoint comes first: its copy's config.json (the run's model config) can carry a
    # provenance an earlier export left in it, which is that export's step, not this checkpoint's.
    step = export_global_step(init)
    return 0 if step is None else step


def _start(run_dir: str, seen: frozenset[str]) -> int | None:
    key = run_dir.rstrip("/") if storage.is_remote(run_dir) else os.path.realpath(run_dir)
    init = rundir.path(run_dir, rundir.INIT_DIR)
    if key in seen or len(seen) >= _LONGEST_CHAIN or not _exists(init):
        return None
    record = _init_record(init)
    recorded = _count(record.get("global_start")) if record is not None else None
    if recorded is not None:
        return recorded
    return copy_start(init, _source_run(record), seen | {key})


def export_global_step(model_dir: str) -> int | None:
    """The global step an export (RUN/model, a snapshot, or a copy of one) was made at, from its
    config.json provenance: `global_step`, else `step` (an export made before global steps were
    recorded, or a run that was never continued). A value that is not a count (a string, a bool,
    a negative number) or a global step below the local one is ignored: it places nothing. None for
    a model of no known step (a published one)."""
    try:
        data = json.loads(storage.read_text(storage.join(model_dir, "config.json")))
    except (OSError, storage.StorageError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    made = data.get(rundir.PROVENANCE_KEY) if isinstance(data, dict) else None
    if not isinstance(made, dict):
        return None
    step, whole = _count(made.get("step")), _count(made.get("global_step"))
    return whole if whole is not None and (step is None or whole >= step) else step


_MOST_STEPS = 2**53  # past any run's steps (and where a float stops counting exactly): a hostile value


def _count(value: object) -> int | None:
    """A step count, or None for anything else (type(): True is an int, not a count)."""
    return value if type(value) is int and 0 <= value < _MOST_STEPS else None


def _init_record(init: str) -> dict | None:
    """RUN/init/source.json, or None (absent or damaged)."""
    try:
        record = json.loads(storage.read_text(rundir.path(init, rundir.INIT_RECORD_FILE)))
    except (OSError, storage.StorageError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _source_run(record: dict | None) -> str | None:
    """The run directory a run's copy came from (its source.json `record`, kind "run"), if it is
    still a run directory; None for a copy of a model directory, a damaged record, or a run that is gone."""
    if record is None or record.get("kind") != "run":
        return None
    where = record.get("resolved") or record.get("source")
    if not isinstance(where, str) or not where:
        return None
    return where if _exists(rundir.path(where, rundir.CONFIG_FILE)) else None


def _exists(path: str) -> bool:
    try:
        return storage.exists(path)
    except (OSError, storage.StorageError):
        return False
