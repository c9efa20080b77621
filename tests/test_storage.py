"""tpu_ray.storage on real local directories and on gs:// served by a real GCS emulator."""

from __future__ import annotations

import errno
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tpu_ray import storage
from tpu_ray.errors import UserError
from tpu_ray.storage import StorageError

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------
@pytest.mark.quick
def test_is_remote_goes_by_scheme_not_substring():
    assert storage.is_remote("gs://bucket/x")
    assert storage.is_remote("gcs://bucket/x")
    assert not storage.is_remote("/data/gs/bucket")
    assert not storage.is_remote("gsutil-data/x")
    assert not storage.is_remote("file:///tmp/x")


@pytest.mark.quick
def test_join_local_and_gs():
    assert storage.join("gs://b", "runs", "r1/", "/x.json") == "gs://b/runs/r1/x.json"
    assert storage.join("gs://b/", "x") == "gs://b/x"
    assert storage.join("/tmp/a/", "b", "c") == "/tmp/a/b/c"
    assert storage.join("rel", "x") == "rel/x"


# --------------------------------------------------------------------------------------------
# Local
# --------------------------------------------------------------------------------------------
@pytest.mark.quick
def test_local_atomic_write_round_trip_leaves_no_temp(tmp_path):
    path = str(tmp_path / "sub" / "manifest.json")
    storage.atomic_write_text(path, "one")
    storage.atomic_write_bytes(path, b"two")
    assert storage.read_text(path) == "two"
    assert storage.read_bytes(path) == b"two"
    assert storage.size(path) == 3
    assert os.listdir(tmp_path / "sub") == ["manifest.json"]


@pytest.mark.quick
def test_local_atomic_write_failure_keeps_old_file_and_cleans_up(tmp_path, monkeypatch):
    path = tmp_path / "manifest.json"
    storage.atomic_write_text(str(path), "old")

    def boom(src, dst):
        assert Path(src).read_text() == "new", "temp file holds the full content before the rename"
        raise OSError("disk vanished")

    monkeypatch.setattr(storage.os, "replace", boom)
    with pytest.raises(OSError, match="disk vanished"):
        storage.atomic_write_text(str(path), "new")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["manifest.json"]


@pytest.mark.quick
def test_local_writer_killed_mid_write_leaves_nothing_a_reader_trusts(tmp_path):
    """A process SIGKILLed after writing the data but before the rename: no file at the final
    path, and the leftover temp file does not match a glob for final names."""
    final = tmp_path / "out" / "train-00000-100.tfrecord"
    code = textwrap.dedent(f"""
        import os, signal
        from tpu_ray import storage
        os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
        storage.atomic_write_bytes({str(final)!r}, b"x" * 100000)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60)
    assert proc.returncode == -9
    assert not final.exists()
    leftovers = os.listdir(final.parent)
    assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-") and leftovers[0].endswith(".tmp")
    assert storage.glob(str(final.parent / "*.tfrecord")) == []
    assert not storage.exists(str(final))


@pytest.mark.quick
def test_local_atomic_copy_file_same_and_cross_filesystem(tmp_path, monkeypatch):
    src = tmp_path / "src.bin"
    src.write_bytes(b"a" * 1000)
    storage.atomic_copy_file(str(src), str(tmp_path / "d" / "one.bin"))
    assert (tmp_path / "d" / "one.bin").read_bytes() == b"a" * 1000

    src.write_bytes(b"b" * 1000)
    real_replace = os.replace

    def cross_device(a, b):  # the first rename (src -> dst) crosses filesystems; the temp one does not
        if a == str(src):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real_replace(a, b)

    monkeypatch.setattr(storage.os, "replace", cross_device)
    storage.atomic_copy_file(str(src), str(tmp_path / "d" / "two.bin"))
    monkeypatch.undo()
    assert (tmp_path / "d" / "two.bin").read_bytes() == b"b" * 1000
    assert sorted(os.listdir(tmp_path / "d")) == ["one.bin", "two.bin"]


@pytest.mark.quick
def test_local_glob_listdir_exists_remove(tmp_path):
    for name in ["b.txt", "a.txt", "c.json"]:
        storage.atomic_write_text(str(tmp_path / name), name)
    storage.makedirs(str(tmp_path / "sub" / "deeper"))
    assert storage.glob(str(tmp_path / "*.txt")) == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert storage.glob(f"file://{tmp_path}/*.json") == [f"file://{tmp_path}/c.json"]
    entries = ["a.txt", "b.txt", "c.json", "sub"]
    assert storage.listdir(str(tmp_path)) == sorted(str(tmp_path / n) for n in entries)
    assert storage.exists(str(tmp_path / "a.txt")) and storage.isdir(str(tmp_path / "sub"))
    storage.remove(str(tmp_path / "a.txt"))
    storage.remove(str(tmp_path / "sub"), recursive=True)
    assert not storage.exists(str(tmp_path / "a.txt")) and not storage.exists(str(tmp_path / "sub"))
    with pytest.raises(FileNotFoundError):
        storage.read_text(str(tmp_path / "a.txt"))


# --------------------------------------------------------------------------------------------
# gs:// on the emulator
# --------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.quick
def test_gcsfs_is_the_plain_json_api_client(gcs_emulator):
    fs, stripped = storage.filesystem("gs://bucket/a/b")
    assert stripped == "bucket/a/b"
    assert type(fs).__name__ != "ExtendedGcsFileSystem"  # no gRPC bucket-type probe
    assert os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] == "false"
    assert fs is storage.filesystem("gs://other/x")[0]  # cached
    clone = pickle.loads(pickle.dumps(fs))
    assert type(clone) is type(fs)


@pytest.mark.timeout(60)
@pytest.mark.quick
def test_gs_round_trip(gcs_emulator, tmp_path):
    root = gcs_emulator.make_bucket()
    storage.makedirs(storage.join(root, "run"))  # no-op on an object store (bucket exists)
    path = storage.join(root, "run", "blob.bin")
    data = bytes(range(256)) * 4096
    storage.atomic_write_bytes(path, data)
    assert storage.read_bytes(path) == data
    assert storage.size(path) == len(data)
    assert storage.exists(path)
    storage.atomic_write_text(storage.join(root, "run", "cfg.yaml"), "a: 1\n")
    assert storage.read_text(storage.join(root, "run", "cfg.yaml")) == "a: 1\n"
    with storage.open(path, "rb") as f:
        assert f.read(10) == data[:10]

    local = tmp_path / "shard.tfrecord"
    local.write_bytes(b"z" * 5000)
    storage.atomic_copy_file(str(local), storage.join(root, "run", "shard.tfrecord"))
    assert storage.read_bytes(storage.join(root, "run", "shard.tfrecord")) == b"z" * 5000

    assert storage.listdir(storage.join(root, "run")) == [
        storage.join(root, "run", n) for n in ["blob.bin", "cfg.yaml", "shard.tfrecord"]]
    storage.remove(path)
    assert not storage.exists(path)
    with pytest.raises(FileNotFoundError) as info:  # a missing object in an existing bucket stays one
        storage.read_bytes(path)
    assert info.value.filename == path


@pytest.mark.timeout(60)
@pytest.mark.quick
def test_gs_glob_is_sorted_and_keeps_the_scheme(gcs_emulator):
    root = gcs_emulator.make_bucket()
    names = ["train-00002-9.tfrecord", "train-00000-9.tfrecord", "valid-00000-3.tfrecord",
             "train-00001-9.tfrecord"]
    for name in names:
        storage.atomic_write_bytes(storage.join(root, "shards", name), b"x")
    got = storage.glob(storage.join(root, "shards", "train-*.tfrecord"))
    assert got == [f"{root}/shards/train-0000{i}-9.tfrecord" for i in range(3)]
    bucket = root[len("gs://"):]
    assert storage.glob(f"gcs://{bucket}/shards/valid-*") == [f"gcs://{bucket}/shards/valid-00000-3.tfrecord"]
    assert storage.glob(storage.join(root, "nothing-here", "*")) == []


@pytest.mark.timeout(60)
def test_gs_listings_see_objects_written_by_another_process(gcs_emulator):
    """Shards are written by Ray actors: a listing must not be served from a stale cache."""
    root = gcs_emulator.make_bucket()
    storage.atomic_write_text(storage.join(root, "d", "a.json"), "1")
    assert storage.glob(storage.join(root, "d", "*.json")) == [f"{root}/d/a.json"]
    code = f"from tpu_ray import storage; storage.atomic_write_text({root + '/d/b.json'!r}, '2')"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)  # inherits the env var
    assert storage.glob(storage.join(root, "d", "*.json")) == [f"{root}/d/a.json", f"{root}/d/b.json"]
    assert storage.exists(storage.join(root, "d", "b.json"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", ["read_bytes", "atomic_write_bytes", "glob", "exists", "makedirs", "listdir"])
@pytest.mark.quick
def test_missing_bucket_is_a_one_line_user_error(gcs_emulator, op):
    path = "gs://no-such-bucket-tpu-ray/run/x.json"
    call = {
        "read_bytes": lambda: storage.read_bytes(path),
        "atomic_write_bytes": lambda: storage.atomic_write_bytes(path, b"{}"),
        "glob": lambda: storage.glob("gs://no-such-bucket-tpu-ray/run/*.json"),
        "exists": lambda: storage.exists(path),
        "makedirs": lambda: storage.makedirs("gs://no-such-bucket-tpu-ray/run"),
        "listdir": lambda: storage.listdir("gs://no-such-bucket-tpu-ray/run"),
    }[op]
    with pytest.raises(StorageError) as info:
        call()
    message = str(info.value)
    assert isinstance(info.value, UserError)
    assert "\n" not in message
    assert message.startswith("gs://no-such-bucket-tpu-ray")
    assert "bucket 'no-such-bucket-tpu-ray' does not exist" in message
    assert message.endswith("create it or fix the path")


@pytest.mark.timeout(60)
def test_unreachable_emulator_fails_fast_with_a_hint(gcs_emulator, monkeypatch):
    import socket

    with socket.socket() as s:  # bound but not listening: connections are refused, the port stays ours
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{s.getsockname()[1]}")
        with pytest.raises(StorageError, match="STORAGE_EMULATOR_HOST") as info:
            storage.read_bytes("gs://bucket/x")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("error, expected", [
    # a refused connection whose port holds the digits 403 is a network failure, not a denial
    (OSError("Cannot connect to host 127.0.0.1:40367 ssl:default [Connect call failed]"),
     "storage request failed"),
    ("http-403", "access denied"),
    ("http-401", "access denied"),
    ("http-500", "storage request failed"),
    # what gcsfs raises for a real 403 from GCS: an OSError whose text starts with the reason
    (OSError("Forbidden: https://storage.googleapis.com/storage/v1/b/bucket/o/x\nCaller does not have "
             "storage.objects.get access"), "access denied"),
])
@pytest.mark.quick
def test_access_denied_is_decided_by_status_code_not_digits_in_the_message(error, expected):
    from gcsfs.retry import HttpError

    if isinstance(error, str):
        code = int(error.split("-")[1])
        error = HttpError({"code": code, "message": f"request failed with status {code}"})
    with pytest.raises(StorageError, match=expected) as info:
        with storage._remote_errors("gs://bucket/x"):
            raise error
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
@pytest.mark.quick
def test_atomic_writes_respect_the_umask(tmp_path, umask, mode):
    """Before, shards, manifest.json and config.yaml were 0600 (mkstemp's mode) while the rest of a
    run is 0644, so another user sharing the run directory could not read them."""
    import os
    import stat

    old = os.umask(umask)
    try:
        storage.atomic_write_text(str(tmp_path / "config.yaml"), "a: 1\n")
        storage.atomic_write_bytes(str(tmp_path / "shard.tfrecord"), b"x" * 10)
        src = tmp_path / "src.json"
        src.write_text("{}")
        storage.atomic_copy_file(str(src), str(tmp_path / "manifest.json"))
    finally:
        os.umask(old)
    for name in ("config.yaml", "shard.tfrecord", "manifest.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name


@pytest.mark.quick
def test_gcs_conditional_writes_answer_412_as_one_clear_result(gcs_emulator):
    """The store's 412 (the object changed since it was read) is a False/None, not a StorageError
    from deep inside gcsfs; the lock turns it into its own one line."""
    from tpu_ray import storage

    path = f"{gcs_emulator.make_bucket()}/obj"
    assert storage.create_if_absent(path, b"a") is True
    assert storage.create_if_absent(path, b"b") is False  # 412 on ifGenerationMatch=0
    gen = storage.generation(path)
    new = storage.replace_if_generation(path, b"c", gen)
    assert new and new != gen and storage.read_bytes(path) == b"c"
    assert storage.replace_if_generation(path, b"d", gen) is None  # stale generation: 412
    assert storage.remove_if_generation(path, gen) is False and storage.read_bytes(path) == b"c"
    assert storage.remove_if_generation(path, new) is True and not storage.exists(path)


@pytest.mark.quick
def test_gcsfs_floor_is_checked_in_one_line_and_matches_pyproject():
    """gcsfs 2024.6-2024.10 have no pipe_file(mode=...): every gs:// lock failed with a TypeError."""
    import importlib.metadata as md

    from tpu_ray import storage

    problem = storage.gcsfs_problem("2024.10.0", "2024.10.0")
    assert problem and problem.startswith("gcsfs 2024.10.0 is installed, but gs:// locks need gcsfs>=2024.12.0")
    assert "\n" not in problem and "pip install -U 'gcsfs>=2024.12.0'" in problem
    assert "fsspec 2024.6.1 is installed" in storage.gcsfs_problem("2024.12.0", "2024.6.1")
    assert "gcsfs is not installed" in storage.gcsfs_problem(None, "2024.12.0")
    assert storage.gcsfs_problem("2024.12.0", "2024.12.0") is None
    assert storage.gcsfs_problem("2025.1.0rc1", "2025.1.0") is None
    assert storage.gcsfs_problem(md.version("gcsfs"), md.version("fsspec")) is None  # this install works
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"gcsfs>={storage.GCSFS_FLOOR}"' in pyproject and f'"fsspec>={storage.GCSFS_FLOOR}"' in pyproject
    # The floor's release has the argument the lock passes (the installed one, at least).
    import inspect

    from gcsfs.core import GCSFileSystem
    assert "mode" in inspect.signature(GCSFileSystem._pipe_file).parameters
