"""A run directory's lock (runlock.py) cannot be turned against its user: the lock never follows a
link, a run directory must be private and ours, and a gs:// lock is owned by a token with a lease
(taken over only once the lease runs out, and a writer that lost it writes nothing more). Real
directories and a real GCS emulator; the lease clock is moved by hand. All quick but the one that
waits out a killed process's lock in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tpu_ray.errors import UserError


@pytest.mark.quick
def test_lock_link_to_a_victim_file_is_refused_and_the_file_kept(tmp_path):
    """Another user's `RUN/.lock -> ~/.bashrc` used to be truncated and overwritten by the lock."""
    from tpu_ray.runlock import RunLock

    victim = tmp_path / "bashrc"
    victim.write_text("export PATH=$HOME/bin:$PATH\n")
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    (run / ".lock").symlink_to(victim)
    with pytest.raises(UserError, match=r"\.lock: is a symbolic link .*remove the link"):
        RunLock(str(run), "tpu-ray run").acquire()
    assert victim.read_text() == "export PATH=$HOME/bin:$PATH\n"


@pytest.mark.quick
def test_lock_hard_link_or_fifo_is_refused(tmp_path):
    from tpu_ray.runlock import RunLock

    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    other = tmp_path / "other"
    other.write_text("keep\n")
    os.link(other, run / ".lock")
    with pytest.raises(UserError, match="a file with 2 names"):
        RunLock(str(run), "tpu-ray run").acquire()
    assert other.read_text() == "keep\n"
    (run / ".lock").unlink()
    os.mkfifo(run / ".lock")
    with pytest.raises(UserError, match="not a plain file"):
        RunLock(str(run), "tpu-ray run").acquire()


@pytest.mark.quick
def test_world_writable_run_dir_is_refused_in_one_line(tmp_path):
    from tpu_ray.runlock import RunLock

    run = tmp_path / "shared"
    run.mkdir()
    run.chmod(0o777)
    with pytest.raises(UserError, match=r"shared: is writable by every user \(mode 0777\).*chmod o-w") as err:
        RunLock(str(run), "tpu-ray run").acquire()
    assert "\n" not in str(err.value)
    assert not (run / ".lock").exists()
    run.chmod(0o1777)  # sticky: others still create names in it (a planted tokenizer/ or model/)
    with pytest.raises(UserError, match="writable by every user"):
        RunLock(str(run), "tpu-ray run").acquire()
    run.chmod(0o755)
    with RunLock(str(run), "tpu-ray run"):
        pass


@pytest.mark.quick
def test_run_dir_of_another_user_is_refused():
    """A directory owned by someone else (here: a system directory owned by a non-root user, if
    the machine has one; else a directory we own but claim is not ours cannot be made)."""
    from tpu_ray.runlock import check_private_dir

    candidates = [p for p in ("/proc/1", "/var/tmp", "/tmp") if os.path.isdir(p)]
    uid = os.getuid()
    others = [p for p in candidates if os.stat(p).st_uid not in (uid, 0)]
    if uid == 0 or not others:
        # Root (or no foreign directory here): a directory owned by uid 0 is accepted, a
        # world-writable one is not (the same check's other half).
        with pytest.raises(UserError, match="writable by every user"):
            check_private_dir("/tmp", "/tmp")
        return
    with pytest.raises(UserError, match="belongs to another user"):
        check_private_dir(others[0], others[0])


@pytest.mark.quick
def test_a_run_dir_planted_as_a_link_to_a_directory_of_ours_is_refused(tmp_path):
    """In a shared sticky parent another user plants RUN -> a directory the victim owns; `os.stat`
    followed the link and the check passed."""
    from tpu_ray.runlock import RunLock

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    (shared / "run").symlink_to(victim)
    with pytest.raises(UserError, match=r"run: is a symbolic link \(to .*victim\).*--output-dir") as err:
        RunLock(str(shared / "run"), "tpu-ray run").acquire()
    assert "\n" not in str(err.value) and os.listdir(victim) == []


@pytest.mark.quick
@pytest.mark.skipif(os.getuid() != 0, reason="making a directory of another user needs root (chown)")
def test_a_run_dir_whose_parent_another_user_owns_is_refused(tmp_path):
    from tpu_ray.runlock import RunLock

    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, 4242, 4242)  # mode 0755: only they can write it, and so rename our run away
    with pytest.raises(UserError, match=r"its parent .*theirs belongs to another user \(uid 4242\)") as err:
        RunLock(str(parent / "run"), "tpu-ray run").acquire()
    assert "\n" not in str(err.value)
    os.chown(parent, os.getuid(), os.getgid())
    with RunLock(str(parent / "run"), "tpu-ray run"):
        pass


class Clock:
    """A wall clock the test moves by hand: lease expiry without waiting."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _lock_content(run: str) -> dict:
    from tpu_ray import storage

    return json.loads(storage.read_text(f"{run}/.lock"))


@pytest.mark.quick
def test_gcs_lock_owner_is_a_token_and_a_dead_pid_on_this_host_is_not_taken_over(gcs_emulator):
    """Two containers sharing a host name see each other's pids as dead: the old takeover
    (same host, pid gone) handed a live lock to a second writer."""
    from tpu_ray import storage
    from tpu_ray.runlock import RunLock

    run = f"{gcs_emulator.make_bucket()}/run"
    clock = Clock()
    holder = RunLock(run, "tpu-ray run", lease_s=60, clock=clock)
    # The live holder in another container: our host name, a pid that does not exist here.
    holder.info["pid"] = 2**22 + 17
    holder.acquire()
    try:
        assert len(_lock_content(run)["token"]) == 32 and _lock_content(run)["lease_s"] == 60
        clock.now += 30  # within the lease
        with pytest.raises(UserError, match=r"in use by .*tpu-ray run.*lease runs to .*delete .*\.lock") as err:
            RunLock(run, "tpu-ray train", lease_s=60, clock=clock).acquire()
        assert "\n" not in str(err.value)
        assert _lock_content(run)["token"] == holder.info["token"]
        # Renewed at +50: at +100 (past the first lease, within the renewed one) still refused.
        clock.now += 20
        assert holder.renew()
        clock.now += 50
        with pytest.raises(UserError, match="in use by"):
            RunLock(run, "tpu-ray train", lease_s=60, clock=clock).acquire()
        # Not renewed for longer than its lease: gone, taken over.
        clock.now += 11
        with RunLock(run, "tpu-ray next", lease_s=60, clock=clock) as taker:
            assert _lock_content(run)["token"] == taker.info["token"]
            assert not holder.renew() and holder.lost  # the old holder learns it lost the lock
    finally:
        holder.release()
    assert not storage.exists(f"{run}/.lock")


def test_gcs_lock_of_a_killed_process_waits_for_its_lease(gcs_emulator):
    from tpu_ray.runlock import RunLock

    run = f"{gcs_emulator.make_bucket()}/run"
    code = (f"from tpu_ray.runlock import RunLock; import os; RunLock({run!r}, 'tpu-ray dead', lease_s=60)"
            ".acquire(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    dead = _lock_content(run)
    with pytest.raises(UserError, match="in use by .*tpu-ray dead"):
        RunLock(run, "tpu-ray next").acquire()
    later = Clock(dead["renewed"] + 61)
    with RunLock(run, "tpu-ray next", clock=later):
        assert _lock_content(run)["command"] == "tpu-ray next"


@pytest.mark.quick
def test_after_the_lock_is_taken_over_the_old_writer_writes_nothing_more(gcs_emulator):
    """`lost` was set by the renewal and never read: metrics, export and shards went on beside
    the new holder's."""
    from tpu_ray import storage
    from tpu_ray.runlock import RunLock

    bucket = gcs_emulator.make_bucket()
    run, other = f"{bucket}/run", f"{bucket}/other"
    clock = Clock()
    old = RunLock(run, "tpu-ray train", lease_s=60, clock=clock)
    old.acquire()
    try:
        storage.atomic_write_text(f"{run}/metrics/a.jsonl", "1\n")  # within the lease
        clock.now += 61  # a renewal outage longer than the lease: another process takes the lock over
        code = (f"import os; from tpu_ray.runlock import RunLock; RunLock({run!r}, 'tpu-ray next', lease_s=60, "
                f"clock=lambda: {clock.now}).acquire(); os._exit(0)")
        subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
        for write in (lambda: storage.atomic_write_text(f"{run}/metrics/b.jsonl", "2\n"),
                      lambda: storage.atomic_write_bytes(f"{run}/model/weights", b"w"),
                      lambda: storage.remove(f"{run}/metrics/a.jsonl")):
            with pytest.raises(UserError, match=r"run: this run's lock was taken over by host .*tpu-ray next"
                                                r".*were not written") as err:
                write()
            assert "\n" not in str(err.value)
        assert old.lost
        assert not storage.exists(f"{run}/metrics/b.jsonl") and not storage.exists(f"{run}/model/weights")
        assert storage.read_text(f"{run}/metrics/a.jsonl") == "1\n"
        storage.atomic_write_text(f"{other}/x", "another run's directory is not fenced\n")
    finally:
        old.release()


@pytest.mark.quick
def test_a_lease_that_ran_out_and_nobody_took_is_renewed_at_the_next_write(gcs_emulator):
    from tpu_ray import storage
    from tpu_ray.runlock import RunLock

    run, clock = f"{gcs_emulator.make_bucket()}/run", Clock()
    with RunLock(run, "tpu-ray train", lease_s=60, clock=clock) as lock:
        clock.now += 100
        storage.atomic_write_text(f"{run}/x", "ok\n")
        assert not lock.lost and json.loads(storage.read_text(f"{run}/.lock"))["renewed"] == clock.now


@pytest.mark.quick
def test_taking_over_rechecks_the_lease_after_reading_the_holder_again(gcs_emulator):
    """`_delete_if` deleted a lock whose token matched even when its holder had renewed since it
    was read as expired: two writers."""
    from tpu_ray import storage
    from tpu_ray.runlock import RunLock

    run, clock = f"{gcs_emulator.make_bucket()}/run", Clock()
    holder = RunLock(run, "tpu-ray train", lease_s=60, clock=clock)
    holder.acquire()
    try:
        clock.now += 61
        taker = RunLock(run, "tpu-ray next", lease_s=60, clock=clock)
        seen = json.loads(storage.read_text(f"{run}/.lock"))
        assert taker.expired(seen)
        assert holder.renew()  # the holder comes back between the taker's read and its delete
        assert taker._delete_if(seen, takeover=True) is False
        assert json.loads(storage.read_text(f"{run}/.lock"))["token"] == holder.info["token"]
    finally:
        holder.release()
