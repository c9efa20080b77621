"""One run directory, one writer: a lock that says who holds it.

Two commands writing one run directory at once each train a tokenizer over the other's, delete the
other's in-flight temp files and leave a half-finished manifest. Every stage that writes takes
this lock first (see pipeline.py), and a second writer is refused with one line naming the holder.

- Local: `fcntl.flock` on `RUN/.lock`. The kernel drops the lock when its process dies, so a
  killed run never leaves a stale lock; the file's content (host, pid, start, command) only
  serves the refusal message. The file is opened without following links (`O_NOFOLLOW`) and must
  be a plain file with one name, and the directory must be ours and not writable by other users:
  on a shared machine another user must not be able to point `.lock` at our `~/.bashrc` (we
  truncate it) or swap the tokenizer, shards or model files while we run.
- gs://: object stores have no flock. The lock is the object `RUN/.lock`, created with
  `ifGenerationMatch=0` (GCS creates it only if absent, atomically; HTTP 412 otherwise). Its
  owner is a random token of this process, and it carries a lease (`lease_s`, renewed every
  third of it by a thread with `ifGenerationMatch` on our own generation). Another process takes
  it over only once the lease has run out: host names and pids prove nothing across containers
  that share a host name. It is deleted on release only while it is still ours. After creating
  it we read it back, so one lock is never handed to two writers that start in turn.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import stat
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from tpu_ray import storage
from tpu_ray.errors import UserError
from tpu_ray.rundir import LOCK_FILE

log = logging.getLogger("tpu_ray")
LEASE_S = 120.0  # a gs:// lock not renewed for this long belongs to a gone process


class LockLost(UserError):
    """A gs:// run's lock went to another process (our lease ran out): this one writes nothing more."""


def describe_holder(info: dict[str, Any]) -> str:
    """`host H pid P since T (tpu-ray train)` from a lock's content."""
    started = info.get("started")
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, (int, float)) else "?"
    return f"host {info.get('host', '?')} pid {info.get('pid', '?')} since {since} ({info.get('command', '?')})"


class RunLock:
    """`with RunLock(run_dir, "tpu-ray train"):` holds the run directory for this process."""

    def __init__(self, run_dir: str, command: str, lease_s: float = LEASE_S,
                 clock: Callable[[], float] = time.time):
        """`lease_s` and `clock` (wall-clock seconds) decide when a gs:// lock is stale; tests pass
        their own clock so that expiry needs no waiting."""
        self.run_dir = run_dir
        self.path = storage.join(run_dir, LOCK_FILE)
        self.lease_s = float(lease_s)
        self.clock = clock
        self.info = {"host": platform.node(), "pid": os.getpid(), "started": clock(), "command": command,
                     "token": uuid.uuid4().hex, "lease_s": self.lease_s, "renewed": clock()}
        self._fd: int | None = None
        self._created_dir = False
        self._held = False
        self._generation: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.lost = False  # gs://: another process took the lock over (our lease ran out)

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
        check_private_dir(directory, self.run_dir)
        local = storage.filesystem(self.path)[1]
        try:
            # O_NONBLOCK: a FIFO planted as .lock must not hang the open (refused below).
            fd = os.open(local, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
        except OSError:
            if os.path.islink(local):
                raise UserError(f"{self.path}: is a symbolic link (to {os.readlink(local)}); a run's lock is "
                                f"a plain file: remove the link and check who made it") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                what = "not a plain file" if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} names"
                raise UserError(f"{self.path}: is {what}; a run's lock is a plain file of its own: remove it and "
                                f"check who made it")
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
        for attempt in range(2):
            holder = self._remote_holder()
            if holder is None:
                self.info["renewed"] = self.clock()
                storage.create_if_absent(self.path, self._content())  # ifGenerationMatch=0
                holder = self._remote_holder() or {}
                if holder.get("token") == self.info["token"]:
                    self._generation = storage.generation(self.path)
                    self._start_renewing()
                    storage.add_fence(self._fence)
                    return
            if attempt == 0 and self.expired(holder):
                log.warning("%s: taking over the lock of %s (its lease ran out)", self.run_dir,
                            describe_holder(holder))
                if not self._delete_if(holder, takeover=True):
                    raise self._refuse(holder, "; it was renewed or changed at the same moment (HTTP 412), "
                                               "so it was not taken over")
                continue
            raise self._refuse(holder, self._stale_hint(holder))
        raise self._refuse(self._remote_holder() or {})

    def expired(self, holder: dict[str, Any]) -> bool:
        """True once `holder`'s lease ran out by our clock. A lock without a lease (written by an
        older tpu-ray) never expires by itself: the message says to delete it."""
        renewed, lease = holder.get("renewed"), holder.get("lease_s")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (renewed, lease)):
            return False
        return self.clock() > renewed + lease

    def _stale_hint(self, holder: dict[str, Any]) -> str:
        renewed, lease = holder.get("renewed"), holder.get("lease_s")
        if isinstance(renewed, (int, float)) and isinstance(lease, (int, float)):
            until = time.strftime("%H:%M:%S UTC", time.gmtime(renewed + lease))
            return f" (its lease runs to {until} unless renewed; if that run is gone, retry after that or delete {self.path})"
        return f" (if that run is gone, delete {self.path})"

    def _content(self) -> bytes:
        return (json.dumps(self.info) + "\n").encode()

    def _remote_holder(self) -> dict[str, Any] | None:
        try:
            return _parse(storage.read_bytes(self.path))
        except FileNotFoundError:
            return None

    def _delete_if(self, holder: dict[str, Any], takeover: bool = False) -> bool:
        """Delete the lock object only if it still has `holder`'s token (and its generation), and,
        taking over another's lock, only while its lease is still expired as read now (it may have
        renewed since `holder` was read); False when it is not to be deleted (or the store refused:
        412, it changed since we read it). The content is read after the generation: a renewal
        in between shows in the content, one after it fails the generation match."""
        try:
            gen = storage.generation(self.path)
        except FileNotFoundError:
            return True
        current = self._remote_holder()
        if current is not None and current.get("token") == holder.get("token"):
            if takeover and not self.expired(current):
                return False
            return storage.remove_if_generation(self.path, gen)
        return True

    def _fence(self, path: str) -> None:
        """Refuse a write into this run directory once the lock is no longer ours (storage calls
        it before every write): one line naming the process that holds it now. A lease that ran
        out by our clock is renewed first if nobody took it over."""
        run = self.run_dir.rstrip("/")
        if path == self.path or not (path.rstrip("/") == run or path.startswith(run + "/")):
            return
        if not self.lost and self.clock() <= self.info["renewed"] + self.lease_s:
            return
        if not self.lost and self.renew():
            return
        holder = self._remote_holder() or {}
        raise LockLost(f"{self.run_dir}: this run's lock was taken over by {describe_holder(holder)} after its "
                       f"lease of {self.lease_s:.0f} s ran out without renewal; {path.rsplit('/', 1)[-1]} and "
                       f"everything after it were not written: let that run finish, then resume this one")

    def renew(self) -> bool:
        """Extend our lease (`renewed` = now), only while the object is still ours: False (and
        `lost`) when another process took it over."""
        current = self._remote_holder()
        if current is None or current.get("token") != self.info["token"] or self._generation is None:
            return self._lose()
        self.info["renewed"] = self.clock()
        generation = storage.replace_if_generation(self.path, self._content(), self._generation)
        if generation is None:  # 412: rewritten since our last renewal
            return self._lose()
        self._generation = generation
        return True

    def _lose(self) -> bool:
        if not self.lost:
            log.error("%s: this run's lock was taken over by another process (the lease of %.0f s ran out "
                      "without renewal); stop this run: two writers now share the directory", self.path, self.lease_s)
        self.lost = True
        return False

    def _start_renewing(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.lease_s / 3):
                try:
                    if not self.renew():
                        return
                except Exception as exc:  # noqa: BLE001 - a failed renewal is retried at the next tick
                    log.warning("%s: lease renewal failed (%s); retried in %.0f s", self.path, exc, self.lease_s / 3)

        self._stop.clear()
        self._renewer = threading.Thread(target=loop, name="tpu-ray-lock-lease", daemon=True)
        self._renewer.start()

    def _release_remote(self) -> None:
        storage.remove_fence(self._fence)
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=30)
            self._renewer = None
        try:
            if not self._delete_if(self.info):
                log.warning("%s: the lock changed before it was released (HTTP 412); it is no longer this run's "
                            "and was left in place", self.path)
        except Exception as exc:  # noqa: BLE001 - the run is done; a stuck lock is reported, not raised
            log.warning("%s: could not remove the lock (%s); delete it before the next run", self.path, exc)


def check_private_dir(directory: str, name: str) -> None:
    """Refuse a local run directory that is a link, that another user owns or can write, or whose
    parent another user owns or can write without the sticky bit (they could rename it away): one
    line naming it and the fix. Root-owned directories pass (only root could write them, and then
    only by the mode).

    `lstat`, not `stat`: in a shared parent another user can plant the run directory's name as a
    link to a directory of ours, and a check that follows it passes that link."""
    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode):
        raise UserError(f"{name}: is a symbolic link (to {os.readlink(directory)}); a run directory must be a "
                        f"directory of its own: pass the real path as --output-dir, or remove the link and check "
                        f"who made it")
    if st.st_uid not in (os.getuid(), 0):
        raise UserError(f"{name}: belongs to another user (uid {st.st_uid}); a run writes only its own directory: "
                        f"choose another --output-dir (e.g. under ~/ or a relative one)")
    if st.st_mode & stat.S_IWOTH:
        raise UserError(f"{name}: is writable by every user (mode {stat.S_IMODE(st.st_mode):04o}), so anyone could "
                        f"swap its files; run `chmod o-w {directory}` or choose another --output-dir")
    parent = os.path.dirname(os.path.abspath(directory))
    pst = os.stat(parent)
    if pst.st_uid not in (os.getuid(), 0):
        raise UserError(f"{name}: its parent {parent} belongs to another user (uid {pst.st_uid}), who could rename "
                        f"the run directory away; choose an --output-dir under a directory of yours")
    if pst.st_mode & stat.S_IWOTH and not pst.st_mode & stat.S_ISVTX:
        raise UserError(f"{name}: its parent {parent} is writable by every user without the sticky bit, so anyone "
                        f"could rename the run directory away; choose another --output-dir")


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        info = json.loads(raw.decode("utf-8") or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return info if isinstance(info, dict) else {}
