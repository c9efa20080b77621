"""One run directory, one writer: a lock that says who holds it.

Two commands writing one run directory at once each train a tokenizer over the other's, delete the
other's in-flight temp files and leave a half-finished manifest. Every stage that writes takes
this lock first (see pipeline.py), and a second writer is refused with one line naming the holder.

- Local: `fcntl.flock` on `RUN/.lock`. The kernel drops the lock when its process dies, so a
  killed run never leaves a stale lock; the file's content (host, pid, start, command) only
  serves the refusal message.
- gs://: object stores have no flock. The lock is the object `RUN/.lock`, created with
  `ifGenerationMatch=0` (GCS creates it only if absent, atomically; HTTP 412 otherwise). It is
  deleted on release only while it is still ours. A holder that died without releasing it leaves
  the object: on the same host a dead pid is recognised and the lock taken over; otherwise the
  message names the object to delete. After creating it we read it back, so a store that ignores
  preconditions (the emulator) still cannot hand one lock to two writers that start in turn.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
import uuid
from typing import Any

from tpu_ray import storage
from tpu_ray.errors import UserError
from tpu_ray.rundir import LOCK_FILE

log = logging.getLogger("tpu_ray")


def describe_holder(info: dict[str, Any]) -> str:
    """`host H pid P since T (tpu-ray train)` from a lock's content."""
    started = info.get("started")
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, (int, float)) else "?"
    return f"host {info.get('host', '?')} pid {info.get('pid', '?')} since {since} ({info.get('command', '?')})"


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


class RunLock:
    """`with RunLock(run_dir, "tpu-ray train"):` holds the run directory for this process."""

    def __init__(self, run_dir: str, command: str):
        self.run_dir = run_dir
        self.path = storage.join(run_dir, LOCK_FILE)
        self.info = {"host": platform.node(), "pid": os.getpid(), "started": time.time(), "command": command,
                     "token": uuid.uuid4().hex}
        self._fd: int | None = None
        self._created_dir = False
        self._held = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _refuse(self, holder: dict[str, Any], extra: str = "") -> UserError:
        return UserError(f"{self.run_dir}: in use by {describe_holder(holder)}; wait for it to finish or use "
                         f"another --output-dir{extra}")

    def acquire(self) -> None:
        if storage.is_remote(self.path):
            self._acquire_remote()
        else:
            self._acquire_local()
        self._held = True

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        if storage.is_remote(self.path):
            self._release_remote()
        else:
            self._release_local()

    # --- local ----------------------------------------------------------------------------------
    def _acquire_local(self) -> None:
        import fcntl

        directory = storage.filesystem(self.run_dir)[1]
        self._created_dir = not os.path.isdir(directory)
        storage.makedirs(self.run_dir)
        local = storage.filesystem(self.path)[1]
        fd = os.open(local, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = _parse(os.read(fd, 4096))
            finally:
                os.close(fd)
            raise self._refuse(holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(self.info) + "\n").encode(), 0)
        self._fd = fd

    def _release_local(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        local = storage.filesystem(self.path)[1]
        directory = storage.filesystem(self.run_dir)[1]
        try:
            os.ftruncate(fd, 0)
            # A directory this command created and left empty (it was refused early) is removed,
            # so a refusal leaves nothing behind.
            if self._created_dir and os.listdir(directory) == [LOCK_FILE]:
                os.remove(local)
                os.rmdir(directory)
        except OSError:
            pass
        finally:
            os.close(fd)

    # --- gs:// ----------------------------------------------------------------------------------
    def _acquire_remote(self) -> None:
        storage.makedirs(self.run_dir)  # a missing bucket is its own one-line error
        data = (json.dumps(self.info) + "\n").encode()
        for attempt in range(2):
            holder = self._remote_holder()
            if holder is None:
                storage.create_if_absent(self.path, data)  # ifGenerationMatch=0
                holder = self._remote_holder() or {}
                if holder.get("token") == self.info["token"]:
                    return
            if attempt == 0 and holder.get("host") == self.info["host"] and not _pid_alive(holder.get("pid")):
                log.warning("%s: taking over the lock of %s (that process is gone)", self.run_dir,
                            describe_holder(holder))
                self._delete_if(holder)
                continue
            raise self._refuse(holder, f" (if that run is gone, delete {self.path})")
        raise self._refuse(self._remote_holder() or {})

    def _remote_holder(self) -> dict[str, Any] | None:
        try:
            return _parse(storage.read_bytes(self.path))
        except FileNotFoundError:
            return None

    def _delete_if(self, holder: dict[str, Any]) -> None:
        """Delete the lock object only if it still has `holder`'s token (and its generation)."""
        try:
            gen = storage.generation(self.path)
        except FileNotFoundError:
            return
        current = self._remote_holder()
        if current is not None and current.get("token") == holder.get("token"):
            storage.remove_if_generation(self.path, gen)

    def _release_remote(self) -> None:
        try:
            self._delete_if(self.info)
        except Exception as exc:  # noqa: BLE001 - the run is done; a stuck lock is reported, not raised
            log.warning("%s: could not remove the lock (%s); delete it before the next run", self.path, exc)


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        info = json.loads(raw.decode("utf-8") or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return info if isinstance(info, dict) else {}
