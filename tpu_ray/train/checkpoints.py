"""A run's checkpoints, in `<run_dir>/checkpoints` on local disk or gs://, with one commit point.

TensorFlow's `CheckpointManager` does the saving, numbering and pruning. What it cannot do is use
our storage layer: on gs:// it writes through TensorFlow's own GCS client, which has its endpoint
compiled in, so it cannot be pointed at an emulator (nothing of it could be tested here) and it
does not share fsspec's credentials and error messages. So for a remote run directory the manager
saves into a local staging directory and each checkpoint is uploaded through `tpu_ray.storage`:
data files first, then the index, then TF's `checkpoint` state file, whose upload is the commit.
A run killed during an upload leaves the previous state file, which names only complete
checkpoints. The layout on gs:// is exactly what TF writes, so `tf.train.latest_checkpoint` and
`tf.train.load_checkpoint` work on it directly.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from typing import Any

import tensorflow as tf

from tpu_ray import storage
from tpu_ray.errors import DamagedRunDir, UserError
from tpu_ray.rundir import CHECKPOINT_STATE_FILE, latest_named
from tpu_ray.train.generation import Generation

log = logging.getLogger(__name__)

STATE_FILE = CHECKPOINT_STATE_FILE  # TF's name for the file that lists the checkpoints and the latest one
_PREFIX = re.compile(r"^(ckpt-\d+)\.(index|data-\d+-of-\d+|position\.json)$")
POSITION_SUFFIX = ".position.json"  # the input position at that checkpoint (see input_position.py)
_DATA = re.compile(r"^data-(\d+)-of-(\d+)$")


def missing_files(prefix: str, names: set[str]) -> list[str]:
    """The files checkpoint `prefix` lacks: its index, or a data shard of the set its files name."""
    mine = [n[len(prefix) + 1:] for n in names if n.startswith(prefix + ".")]
    missing = [] if "index" in mine else [f"{prefix}.index"]
    counts = {int(m.group(2)) for m in map(_DATA.match, mine) if m}
    total = max(counts) if counts else 1
    have = {int(m.group(1)) for m in map(_DATA.match, mine) if m}
    missing += [f"{prefix}.data-{i:05d}-of-{total:05d}" for i in range(total) if i not in have]
    return missing


def pick_latest(directory: str, state_text: str | None, names: set[str]) -> tuple[str | None, str | None]:
    """(checkpoint to restore, warning) from TF's state file and the names of the files present.

    The state file names the latest checkpoint; if some of its files are gone (deleted, a copy cut
    short), the newest complete checkpoint is taken instead and the warning says which. If none is
    complete while the state file names one (a committed checkpoint was damaged), a DamagedRunDir
    names the missing file: never a silent restart from step 0. If none is complete and none was
    ever committed (the process died while writing the first checkpoint), nothing can be lost by
    starting at step 0: (None, a warning that says so).
    """
    prefixes = {m.group(1) for m in map(_PREFIX.match, names) if m}
    complete = sorted((p for p in prefixes if not missing_files(p, names)), key=lambda p: int(p.split("-")[1]))
    named = latest_named(state_text)
    state_path = storage.join(directory, STATE_FILE)
    if named and named in complete:
        return named, None
    if named:
        gone = missing_files(named, names)[0]
        why = f"{storage.join(directory, gone)} is missing (named as the latest by {state_path})"
    elif prefixes:
        why = f"{state_path} is missing or names no checkpoint"
        if not complete:
            partial = ", ".join(sorted(prefixes, key=lambda p: int(p.split("-")[1])))
            return None, (f"{directory}: no checkpoint was ever completed ({partial} was interrupted while "
                          f"being written and nothing was committed); nothing is lost by starting at step 0, "
                          f"so training starts at step 0")
    else:
        return None, None
    if not complete:
        raise DamagedRunDir(f"{why} and no other checkpoint is complete; restore the file, or delete "
                        f"{directory} to start over")
    return complete[-1], f"{why}; resuming from {storage.join(directory, complete[-1])}, the newest complete checkpoint"


class CheckpointTimer:
    """`due()` once `minutes` have passed since the last `reset()` (never if minutes is None)."""

    def __init__(self, minutes: float | None):
        import time

        self._clock = time.monotonic
        self.seconds = minutes * 60.0 if minutes else None
        self._last = self._clock()

    def due(self) -> bool:
        return self.seconds is not None and self._clock() - self._last >= self.seconds

    def reset(self) -> None:
        self._last = self._clock()


class CheckpointStore:
    """Save, find and restore the checkpoints of `directory` (local path or URL).

    `write=False` is for the non-chief workers of a multi-worker run: they must take part in every
    save (a collective), so they save into a scratch directory that nobody reads, and they restore
    from the chief's `directory`.
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, directory: str, keep: int, *,
                 write: bool = True, options: tf.train.CheckpointOptions | None = None,
                 skip_busy: bool = True, generation: Generation | None = None):
        self.directory = directory
        self.generation = generation  # this attempt's fencing token: checked before every commit and prune
        self.skip_busy = skip_busy  # False: a save while an upload runs waits for it instead
        self.remote = storage.is_remote(directory)
        self.write = write
        self.options = options
        self._staging = (tempfile.TemporaryDirectory(prefix="tpu-ray-ckpt-")
                         if self.remote or not write else None)
        self._executor = None
        self._upload = None  # the Future of the upload in flight (gs:// only)
        self.committed: list[str] = []  # checkpoints committed by this store, in order
        self.skipped: list[int] = []  # steps whose save was skipped while an upload ran
        local = self._staging.name if self._staging else directory
        self.present = False  # any checkpoint file at all (a fresh start must not overwrite them)
        self.problem: UserError | None = None  # files present, none complete: raised by restore()
        self.saved_any = False  # this store saved a checkpoint (else close() withdraws the generation claim)
        self.started_over: str | None = None  # why a run with only a half-written first checkpoint starts at 0
        self.latest: str | None = None  # what restore() reads: a staged copy of a remote run
        try:
            chosen = self._choose()
            if chosen and self.remote:
                self._download(chosen, local)
            elif chosen and write and self._warning:  # drop the damaged one from TF's state file
                tf.compat.v1.train.update_checkpoint_state(directory, chosen, self._kept)
            self.manager = tf.train.CheckpointManager(checkpoint, local, max_to_keep=keep)
        except BaseException:
            self.close()
            raise
        if chosen:
            self.latest = os.path.join(local if self.remote else directory, chosen)
            if self._warning:
                log.warning("%s", self._warning)

    @property
    def latest_saved(self) -> str | None:
        """The newest checkpoint in `directory`: saved by this run, else the one restored."""
        newest = self.manager.latest_checkpoint if self.write else None
        return storage.join(self.directory, os.path.basename(newest)) if newest else self.latest_url

    @property
    def latest_url(self) -> str | None:
        """The latest committed checkpoint as it is named in `directory` (not its staged copy)."""
        return storage.join(self.directory, os.path.basename(self.latest)) if self.latest else None

    def _choose(self) -> str | None:
        """The checkpoint to restore (see pick_latest); sets `present`, `problem`, `_warning`."""
        self._warning = None
        if not storage.exists(self.directory):
            return None
        names = set(self._remote_checkpoint_files())
        state_path = storage.join(self.directory, STATE_FILE)
        state = storage.read_text(state_path) if storage.exists(state_path) else None
        self.present = bool(names) or state is not None
        try:
            chosen, self._warning = pick_latest(self.directory, state, names)
        except UserError as exc:
            self.problem = exc
            return None
        if chosen is None and self._warning:  # only an interrupted first checkpoint: start at step 0
            self.present = False
            self.started_over = self._warning
            self._warning = None
            log.warning("%s", self.started_over)
            if self.write:  # its files would otherwise mix with the new ckpt-N of the same number
                for base in names:
                    storage.remove(storage.join(self.directory, base))
            return None
        prefixes = {m.group(1) for m in map(_PREFIX.match, names) if m}
        def step(prefix: str) -> int:
            return int(prefix.split("-")[1])

        self._kept = sorted((p for p in prefixes if not missing_files(p, names) and chosen and step(p) <= step(chosen)),
                            key=step)  # what TF's state file lists after a fallback or a download
        return chosen

    def restore(self, checkpoint: tf.train.Checkpoint, partial: bool = False) -> None:
        """Load `self.latest` into `checkpoint`; every saved object must match. `partial`: only the
        model (and step) are restored, the rest of the checkpoint (optimizer slots, which another
        precision or optimizer shapes differently) is left unread; every model variable must still
        come from the checkpoint, else a one-line error (never freshly initialised layers evaluated).

        A checkpoint whose bytes fail TF's checksums is named, with the way back to the previous one.
        """
        if self.problem is not None:
            raise self.problem
        try:
            if partial:
                target = tf.train.Checkpoint(**{k: getattr(checkpoint, k) for k in ("model", "step")
                                                if hasattr(checkpoint, k)})
                status = target.restore(self.latest, options=self.options)
                status.expect_partial()
                self._require_matched(status, "model")
            else:
                status = checkpoint.restore(self.latest, options=self.options)
                self._require_matched(status, "model and optimizer")
        except (tf.errors.DataLossError, tf.errors.OutOfRangeError, tf.errors.InvalidArgumentError) as exc:
            url = self.latest_url
            # The half-done restore warns about "unrestored values" when it is collected, after our
            # one line; nothing of it is of use once the checkpoint is known to be corrupt.
            logging.getLogger("tensorflow").setLevel(logging.ERROR)
            reason = re.sub(r"\{\{[^}]*\}\}\s*", "", str(exc)).strip().splitlines()[0]
            reason = re.sub(r"TensorBundle at \S+|\s*\[Op:\w+\]", lambda m: "data file" if m.group(0).startswith("T")
                            else "", reason)[:160]
            raise DamagedRunDir(f"{url}: checkpoint is corrupt ({reason}); to resume from the previous "
                            f"checkpoint, delete {url}.* and rerun with --resume") from None

    def _require_matched(self, status: Any, what: str) -> None:
        """Every variable of the restored objects (`what`) was in the checkpoint, else one line naming one."""
        try:
            status.assert_existing_objects_matched()
        except AssertionError as exc:
            text = str(exc)  # "Found N Python objects that were not bound ... [<tf.Variable 'name:0' ...>, ...]"
            found = re.search(r"Found (\d+) Python objects", text)
            name = re.search(r"<tf\.Variable '([^']+)'", text)
            count = found.group(1) if found else "some"
            example = f" (e.g. {name.group(1)})" if name else ""
            raise UserError(f"{self.latest_url}: {count} object(s) of this {what} are not in the checkpoint{example}; "
                            f"it was saved by another {what}: use the run's saved config (config.yaml) and "
                            f"precision") from None

    def stored_position(self) -> str | None:
        """The input position saved with the latest checkpoint (JSON text), if it has one."""
        if not self.latest:
            return None
        path = self.latest + POSITION_SUFFIX
        return storage.read_text(path) if storage.exists(path) else None

    def save(self, step: int, position: str | None = None, final: bool = False) -> str | None:
        """Save checkpoint `ckpt-<step>` (with `position`, the input position, beside it), commit it
        and prune to the last `keep`; returns its path, or None if it was skipped.

        On gs:// the save is written to local staging and uploaded by a background thread, so
        training goes on while it uploads; it is committed (the state file) when the upload is
        complete. A save asked for while the previous upload still runs is skipped (the next one
        is at most an interval later), except a `final` one, which waits for it and for its own
        upload. An upload error is raised by the next save, `final` or `close`.
        """
        if self.remote and self.write and self._upload is not None:
            if not self._upload.done() and not final and self.skip_busy:
                log.info("checkpoint at step %d skipped: the previous one is still uploading", step)
                self.skipped.append(step)
                return None
            self._finish_upload()
        local_dir = self._staging.name if self._staging else self.directory
        if self.write and self.generation is not None and not self.remote:  # TF's save commits and prunes here
            self.generation.check(f"checkpoint ckpt-{step}")
        if position is not None and self.write:  # written first: committed with (or before) the index
            storage.atomic_write_text(os.path.join(local_dir, f"ckpt-{step}{POSITION_SUFFIX}"), position)
        local_prefix = self.manager.save(checkpoint_number=step, options=self.options)
        if not self.saved_any and self.write and self.generation is not None:
            self.generation.settle()
        self.saved_any = True
        name = os.path.basename(local_prefix)
        if not self.write:  # a non-chief worker's part of the collective save: nobody reads it
            self._drop_staged(name)
            return None
        if not self.remote:
            self._prune_local_positions()
            return local_prefix
        # What the commit will say, as of now (the staged state file may change by the next save).
        with open(os.path.join(self._staging.name, STATE_FILE), encoding="utf-8") as f:
            state = f.read()
        kept = [os.path.basename(p) for p in self.manager.checkpoints]
        self._upload = self._uploader().submit(self._upload_and_commit, name, state, kept)
        if final:
            self._finish_upload()
        return storage.join(self.directory, name)

    def _uploader(self):
        """One background thread: uploads are sequential, so commits happen in step order."""
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpu-ray-ckpt-upload")
        return self._executor

    def _upload_and_commit(self, name: str, state: str, kept: list[str]) -> None:
        if self.generation is not None:  # a superseded attempt uploads nothing at all
            self.generation.check(f"upload of {name}")
        staged = self._staged_files(name)
        for f in sorted(staged, key=lambda f: f.endswith(".index")):  # the index after its data
            storage.atomic_copy_file(os.path.join(self._staging.name, f), storage.join(self.directory, f))
        if self.generation is not None:
            self.generation.check(f"commit of {name}")
        storage.atomic_write_text(storage.join(self.directory, STATE_FILE), state)  # the commit
        self.committed.append(name)
        log.info("checkpoint %s committed to %s", name, self.directory)
        # Only the state file is needed locally from here on: a TPU VM's boot disk should not hold
        # `keep` copies of a large model's checkpoint.
        self._drop_staged(name)
        try:
            if self.generation is not None:
                self.generation.check("pruning of old checkpoints")
            self._prune_remote(set(kept))
        except storage.StorageError as exc:  # the commit stands; the next save prunes again
            log.warning("%s: could not delete old checkpoints yet (%s)", self.directory, exc)

    def _finish_upload(self) -> None:
        """Wait for the upload in flight (if any); raise its error."""
        upload, self._upload = self._upload, None
        if upload is not None:
            upload.result()

    def _prune_local_positions(self) -> None:
        """TF's manager prunes its own files; the position files of pruned checkpoints go here."""
        kept = {os.path.basename(p) for p in self.manager.checkpoints}
        for f in os.listdir(self.directory):
            if f.endswith(POSITION_SUFFIX) and f[: -len(POSITION_SUFFIX)] not in kept:
                os.remove(os.path.join(self.directory, f))

    def _staged_files(self, name: str) -> list[str]:
        return sorted(f for f in os.listdir(self._staging.name) if f.startswith(name + "."))

    def _drop_staged(self, name: str) -> None:
        for f in self._staged_files(name):
            os.remove(os.path.join(self._staging.name, f))

    def close(self, wait: bool = True) -> None:
        """Finish the upload in flight (raising its error) unless `wait` is False, then clean up."""
        try:
            if self._upload is not None:
                if wait:
                    self._finish_upload()
                else:  # the run is failing anyway: let the upload end, keep the first error
                    self._upload.exception()
                    self._upload = None
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if self.generation is not None and self.write and not self.saved_any:
                try:
                    self.generation.withdraw()
                except Exception as exc:  # noqa: BLE001 - the run's own outcome matters more
                    log.warning("%s: could not withdraw the unused generation claim (%s)", self.directory, exc)
            if self._staging is not None:
                self._staging.cleanup()
                self._staging = None

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(wait=exc_type is None)

    # --- remote ---------------------------------------------------------------------------------
    def _download(self, latest: str, local: str) -> None:
        """Stage the files of checkpoint `latest`, then a state file naming it and the older
        complete ones (which the manager keeps and prunes; only `latest` is staged)."""
        for base, prefix in self._remote_checkpoint_files().items():
            if prefix == latest:
                storage.download_file(storage.join(self.directory, base), os.path.join(local, base))
        tf.compat.v1.train.update_checkpoint_state(local, latest, self._kept)  # last: TF sees a complete copy
        log.info("staged checkpoint %s from %s", latest, self.directory)

    def _prune_remote(self, kept: set[str]) -> None:
        """Delete remote files of checkpoints the manager no longer keeps (after the commit)."""
        for base, prefix in self._remote_checkpoint_files().items():
            if prefix not in kept:
                storage.remove(storage.join(self.directory, base))

    def _remote_checkpoint_files(self) -> dict[str, str]:
        """{file name: its checkpoint prefix} for the checkpoint files in `directory`."""
        names = (p.rstrip("/").rsplit("/", 1)[-1] for p in storage.listdir(self.directory))
        return {m.group(0): m.group(1) for m in map(_PREFIX.match, names) if m}
