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
from tpu_ray.errors import UserError

log = logging.getLogger(__name__)

STATE_FILE = "checkpoint"  # TF's name for the file that lists the checkpoints and the latest one
_PREFIX = re.compile(r"^(ckpt-\d+)\.(index|data-\d+-of-\d+|position\.json)$")
POSITION_SUFFIX = ".position.json"  # the input position at that checkpoint (see input_position.py)


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
                 skip_busy: bool = True):
        self.directory = directory
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
        try:
            if self._staging and self.remote:
                self._download_latest(local)
            self.manager = tf.train.CheckpointManager(checkpoint, local, max_to_keep=keep)
        except BaseException:
            self.close()
            raise
        # What restore() reads: the staged copy of a remote run, else the run's own directory.
        self.latest: str | None = (self.manager.latest_checkpoint if self.remote
                                   else tf.train.latest_checkpoint(directory))

    @property
    def latest_url(self) -> str | None:
        """The latest committed checkpoint as it is named in `directory` (not its staged copy)."""
        return storage.join(self.directory, os.path.basename(self.latest)) if self.latest else None

    def restore(self, checkpoint: tf.train.Checkpoint, partial: bool = False) -> None:
        """Load `self.latest` into `checkpoint`; every saved object must match unless `partial`."""
        status = checkpoint.restore(self.latest, options=self.options)
        if partial:
            status.expect_partial()
        else:
            status.assert_existing_objects_matched()

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
        if position is not None and self.write:  # written first: committed with (or before) the index
            storage.atomic_write_text(os.path.join(local_dir, f"ckpt-{step}{POSITION_SUFFIX}"), position)
        local_prefix = self.manager.save(checkpoint_number=step, options=self.options)
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
        staged = self._staged_files(name)
        for f in sorted(staged, key=lambda f: f.endswith(".index")):  # the index after its data
            storage.atomic_copy_file(os.path.join(self._staging.name, f), storage.join(self.directory, f))
        storage.atomic_write_text(storage.join(self.directory, STATE_FILE), state)  # the commit
        self.committed.append(name)
        log.info("checkpoint %s committed to %s", name, self.directory)
        # Only the state file is needed locally from here on: a TPU VM's boot disk should not hold
        # `keep` copies of a large model's checkpoint.
        self._drop_staged(name)
        try:
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
            if self._staging is not None:
                self._staging.cleanup()
                self._staging = None

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(wait=exc_type is None)

    # --- remote ---------------------------------------------------------------------------------
    def _download_latest(self, local: str) -> None:
        """Stage the committed state file and the files of the checkpoint it names as latest."""
        state_path = storage.join(self.directory, STATE_FILE)
        if not storage.exists(state_path):
            return
        state_text = storage.read_text(state_path)
        match = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', state_text, re.M)
        if not match:
            return
        latest = os.path.basename(match.group(1))
        files = self._remote_checkpoint_files()
        if f"{latest}.index" not in files:
            raise UserError(f"{state_path}: names checkpoint {latest}, but {latest}.index is missing; "
                            f"restore the files or delete the state file to resume from nothing")
        for base, prefix in files.items():
            if prefix == latest:
                storage.download_file(storage.join(self.directory, base), os.path.join(local, base))
        with open(os.path.join(local, STATE_FILE), "w", encoding="utf-8") as f:
            f.write(state_text)  # last: the staged copy is complete before TF can see it
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
