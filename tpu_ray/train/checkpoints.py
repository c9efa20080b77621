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
from tpu_ray.errors import UserError, first_line
from tpu_ray.rundir import CHECKPOINT_STATE_FILE

log = logging.getLogger(__name__)

STATE_FILE = CHECKPOINT_STATE_FILE  # TF's name for the file that lists the checkpoints and the latest one
_PREFIX = re.compile(r"^(ckpt-\d+)\.(index|data-\d+-of-\d+)$")
_DATA = re.compile(r"^data-(\d+)-of-(\d+)$")
_LATEST = re.compile(r'^model_checkpoint_path:\s*"([^"]+)"', re.M)


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
    complete, a UserError names the missing file: never a silent restart from step 0.
    """
    prefixes = {m.group(1) for m in map(_PREFIX.match, names) if m}
    complete = sorted((p for p in prefixes if not missing_files(p, names)), key=lambda p: int(p.split("-")[1]))
    match = _LATEST.search(state_text or "")
    named = os.path.basename(match.group(1)) if match else None
    state_path = storage.join(directory, STATE_FILE)
    if named and named in complete:
        return named, None
    if named:
        gone = missing_files(named, names)[0]
        why = f"{storage.join(directory, gone)} is missing (named as the latest by {state_path})"
    elif prefixes:
        why = f"{state_path} is missing or names no checkpoint"
    else:
        return None, None
    if not complete:
        raise UserError(f"{why} and no other checkpoint is complete; restore the file, or delete "
                        f"{directory} to start over")
    return complete[-1], f"{why}; resuming from {storage.join(directory, complete[-1])}, the newest complete checkpoint"


class CheckpointStore:
    """Save, find and restore the checkpoints of `directory` (local path or URL).

    `write=False` is for the non-chief workers of a multi-worker run: they must take part in every
    save (a collective), so they save into a scratch directory that nobody reads, and they restore
    from the chief's `directory`.
    """

    def __init__(self, checkpoint: tf.train.Checkpoint, directory: str, keep: int, *,
                 write: bool = True, options: tf.train.CheckpointOptions | None = None):
        self.directory = directory
        self.remote = storage.is_remote(directory)
        self.write = write
        self.options = options
        self._staging = (tempfile.TemporaryDirectory(prefix="tpu-ray-ckpt-")
                         if self.remote or not write else None)
        local = self._staging.name if self._staging else directory
        self.present = False  # any checkpoint file at all (a fresh start must not overwrite them)
        self.problem: UserError | None = None  # files present, none complete: raised by restore()
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
        prefixes = {m.group(1) for m in map(_PREFIX.match, names) if m}
        step = (lambda p: int(p.split("-")[1]))
        self._kept = sorted((p for p in prefixes if not missing_files(p, names) and chosen and step(p) <= step(chosen)),
                            key=step)  # what TF's state file lists after a fallback or a download
        return chosen

    def restore(self, checkpoint: tf.train.Checkpoint, partial: bool = False) -> None:
        """Load `self.latest` into `checkpoint`; every saved object must match unless `partial`.

        A checkpoint whose bytes fail TF's checksums is named, with the way back to the previous one.
        """
        if self.problem is not None:
            raise self.problem
        try:
            status = checkpoint.restore(self.latest, options=self.options)
            if partial:
                status.expect_partial()
            else:
                status.assert_existing_objects_matched()
        except (tf.errors.DataLossError, tf.errors.OutOfRangeError, tf.errors.InvalidArgumentError) as exc:
            url = self.latest_url
            # The half-done restore warns about "unrestored values" when it is collected, after our
            # one line; nothing of it is of use once the checkpoint is known to be corrupt.
            logging.getLogger("tensorflow").setLevel(logging.ERROR)
            reason = re.sub(r"\{\{[^}]*\}\}\s*", "", str(exc)).strip().splitlines()[0]
            reason = re.sub(r"TensorBundle at \S+|\s*\[Op:\w+\]", lambda m: "data file" if m.group(0).startswith("T")
                            else "", reason)[:160]
            raise UserError(f"{url}: checkpoint is corrupt ({reason}); to resume from the previous "
                            f"checkpoint, delete {url}.* and rerun with --resume") from None

    def save(self, step: int) -> str | None:
        """Save checkpoint `ckpt-<step>`, commit it and prune to the last `keep`; returns its path."""
        local_prefix = self.manager.save(checkpoint_number=step, options=self.options)
        name = os.path.basename(local_prefix)
        if not self.write:  # a non-chief worker's part of the collective save: nobody reads it
            self._drop_staged(name)
            return None
        if not self.remote:
            return local_prefix
        staged = self._staged_files(name)
        for f in sorted(staged, key=lambda f: f.endswith(".index")):  # the index after its data
            storage.atomic_copy_file(os.path.join(self._staging.name, f), storage.join(self.directory, f))
        storage.atomic_copy_file(os.path.join(self._staging.name, STATE_FILE),
                                 storage.join(self.directory, STATE_FILE))  # the commit
        # Only the state file is needed locally from here on: a TPU VM's boot disk should not hold
        # `keep` copies of a large model's checkpoint.
        self._drop_staged(name)
        try:
            self._prune_remote()
        except storage.StorageError as exc:  # the commit stands; the next save prunes again
            log.warning("%s: could not delete old checkpoints yet (%s)", self.directory, exc)
        return storage.join(self.directory, name)

    def _staged_files(self, name: str) -> list[str]:
        return sorted(f for f in os.listdir(self._staging.name) if f.startswith(name + "."))

    def _drop_staged(self, name: str) -> None:
        for f in self._staged_files(name):
            os.remove(os.path.join(self._staging.name, f))

    def close(self) -> None:
        if self._staging is not None:
            self._staging.cleanup()
            self._staging = None

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- remote ---------------------------------------------------------------------------------
    def _download(self, latest: str, local: str) -> None:
        """Stage the files of checkpoint `latest`, then a state file naming it and the older
        complete ones (which the manager keeps and prunes; only `latest` is staged)."""
        for base, prefix in self._remote_checkpoint_files().items():
            if prefix == latest:
                storage.download_file(storage.join(self.directory, base), os.path.join(local, base))
        tf.compat.v1.train.update_checkpoint_state(local, latest, self._kept)  # last: TF sees a complete copy
        log.info("staged checkpoint %s from %s", latest, self.directory)

    def _prune_remote(self) -> None:
        """Delete remote files of checkpoints the manager no longer keeps (after the commit)."""
        kept = {os.path.basename(p) for p in self.manager.checkpoints}
        for base, prefix in self._remote_checkpoint_files().items():
            if prefix not in kept:
                storage.remove(storage.join(self.directory, base))

    def _remote_checkpoint_files(self) -> dict[str, str]:
        """{file name: its checkpoint prefix} for the checkpoint files in `directory`."""
        names = (p.rstrip("/").rsplit("/", 1)[-1] for p in storage.listdir(self.directory))
        return {m.group(0): m.group(1) for m in map(_PREFIX.match, names) if m}
