"""A fencing token per training attempt: after a partition, only the newest attempt writes checkpoints.

Why: recovery (cluster/recovery.py) gives up on an attempt whose node it lost and starts another
from the last commit, but the lost node may still be alive behind a partition, training and
uploading. Its checkpoint commit would overwrite the replacement's state file, and its pruning
would delete the replacement's checkpoints. RunLock cannot stop it: the driver holds the lock, not
the training task.

How: each attempt claims the next generation by creating `RUN/checkpoints/generation-<n>` with
create-if-absent (O_EXCL locally, `ifGenerationMatch=0` on gs://: the same primitive as runlock),
n one above the highest present; losing that race moves on to n+1. The newest generation owns the
directory; once it has saved a checkpoint it removes the older claim files (only the highest is read). Every checkpoint commit and every prune first checks that no higher generation exists;
an older attempt's write is refused with a one-line `Superseded` error and that attempt stops.
(A check and the write after it are two requests, so a claim landing between them is not caught
by that write, but by the next one: one checkpoint at most, never the newer attempt's pruning.)
"""

from __future__ import annotations

import json
import os
import platform
import re
import time

from tpu_ray import storage
from tpu_ray.errors import Superseded

PREFIX = "generation-"
_NAME = re.compile(r"^generation-(\d+)$")


class Generation:
    """This attempt's fencing token for the checkpoints of one run directory."""

    def __init__(self, directory: str):
        self.directory = directory  # RUN/checkpoints
        self.mine: int | None = None

    def claimed(self) -> list[int]:
        """The generations claimed so far in `directory`."""
        if not storage.exists(self.directory):
            return []
        names = (p.rstrip("/").rsplit("/", 1)[-1] for p in storage.listdir(self.directory))
        return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)

    def claim(self) -> int:
        """Take the next generation (create-if-absent; a lost race takes the one after)."""
        storage.makedirs(self.directory)
        n = max(self.claimed(), default=0) + 1
        note = json.dumps({"host": platform.node(), "pid": os.getpid(), "claimed": time.time()}).encode()
        while not storage.create_if_absent(storage.join(self.directory, f"{PREFIX}{n}"), note):
            n += 1
        self.mine = n
        return n

    def settle(self) -> None:
        """After this attempt's first checkpoint: remove the older claims (only the highest is ever
        read, and this one now stays, so numbers keep rising even if a later attempt withdraws)."""
        for old in self.claimed():
            if self.mine is not None and old < self.mine:
                try:
                    storage.remove(storage.join(self.directory, f"{PREFIX}{old}"))
                except (FileNotFoundError, storage.StorageError):
                    pass  # another attempt removed it first

    def withdraw(self) -> None:
        """Give the claim back when this attempt wrote nothing (it failed before its first checkpoint):
        the directory is as it was, so a refused command leaves no trace. Safe for fencing: an older
        attempt that becomes the newest again overwrites nothing newer than its own work."""
        if self.mine is None:
            return
        storage.remove(storage.join(self.directory, f"{PREFIX}{self.mine}"))
        self.mine = None
        if not storage.is_remote(self.directory):
            try:
                os.rmdir(storage.filesystem(self.directory)[1])  # only if empty (we may have made it)
            except OSError:
                pass

    def check(self, what: str) -> None:
        """Raise `Superseded` if a newer attempt has claimed the directory (before `what` writes)."""
        if self.mine is None:
            return
        newest = max(self.claimed(), default=self.mine)
        if newest > self.mine:
            raise Superseded(f"{self.directory}: training attempt {self.mine} was superseded by attempt {newest} "
                             f"(recovery started a newer one); refusing its {what} and stopping this attempt")
