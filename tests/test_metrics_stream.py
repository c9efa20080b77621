"""The metrics stream's local writers: one file per writer where appends are not atomic across hosts
(a shared run directory, NFS and kin), records never torn, every file read back as one stream."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.quick

# One writer process: waits for the start file, then writes records of every size, from a few
# bytes to 200 KB (a buffered file object splits anything over 8 KiB into several writes), each
# carrying the digest of its payload.
WRITER = """
import hashlib, os, sys, time
from tpu_ray.metrics_stream import MetricsWriter
run, name, shared, go, n = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4], int(sys.argv[5])
writer = MetricsWriter(run, shared=shared)
open(go + "." + name, "w").close()  # ready
while not os.path.exists(go):
    time.sleep(0.005)
for i in range(n):
    payload = (name * 200_000)[: (7, 300, 5_000, 70_000, 200_000)[i % 5] + i]
    writer.event("tick", writer=name, i=i, payload=payload, sha=hashlib.sha256(payload.encode()).hexdigest())
    time.sleep(0.003)  # the other writer's turn: their records interleave
writer.close()
"""


def _write_from_two_processes(run: Path, shared: bool, n: int) -> None:
    go = run.parent / f"go-{run.name}"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(run), name, "1" if shared else "0", str(go), str(n)],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name in ("a", "b")]
    deadline = time.monotonic() + 60
    while not all(Path(f"{go}.{name}").exists() for name in ("a", "b")):  # both ready: then both write at once
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [p.poll() for p in procs]
        time.sleep(0.01)
    go.write_text("")
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out


@pytest.mark.parametrize("shared", [True, False], ids=["shared-run-dir", "local-disk"])
def test_two_processes_writing_at_once_leave_every_record_whole(tmp_path, shared):
    """Two processes write records of every size to one run at the same time: a shared run directory
    (ray.shared_filesystem; NFS does not keep appends from two hosts apart) gives each its own file
    under metrics/ and no metrics.jsonl; a local disk appends each record with one write. Either way
    every record reads back whole, each writer's in its order."""
    from tpu_ray.metrics_stream import read_records

    run = tmp_path / "run"
    run.mkdir()
    n = 60
    _write_from_two_processes(run, shared, n)
    records = [r for r in read_records(str(run)) if r.get("event") == "tick"]
    assert len(records) == 2 * n
    for r in records:
        assert hashlib.sha256(r["payload"].encode()).hexdigest() == r["sha"]
    for name in ("a", "b"):
        assert [r["i"] for r in records if r["writer"] == name] == list(range(n))
    spans = [(min(r["time"] for r in records if r["writer"] == w), max(r["time"] for r in records if r["writer"] == w))
             for w in ("a", "b")]
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans  # they wrote at the same time
    if shared:
        assert not (run / "metrics.jsonl").exists()
        files = sorted((run / "metrics").glob("*.jsonl"))
        assert len(files) == 2  # one per writer
        assert {json.loads(f.read_text().splitlines()[0])["writer"] for f in files} == {"a", "b"}
    else:
        assert not (run / "metrics").exists() and (run / "metrics.jsonl").exists()


def test_a_shared_run_is_one_stream_for_metrics_report_and_later_writers(tmp_path, capsys):
    """An older run's metrics.jsonl, then the pipeline's writer on the shared run directory, then a
    writer that knows nothing of the config (the trainer's on another host): the later two write
    files of their own, and `tpu-ray metrics` and load_metrics show one stream in time order."""
    from tpu_ray.cli import main
    from tpu_ray.metrics_stream import MetricsWriter
    from tpu_ray.report import load_metrics

    run = tmp_path / "run"
    run.mkdir()
    older = {"kind": "train", "step": 5, "time": time.time() - 60, "loss": 2.0}
    (run / "metrics.jsonl").write_text(json.dumps(older) + "\n")  # a run directory of an older version
    pipeline = MetricsWriter(str(run), shared=True)
    pipeline.event("stage_start", stage="train")
    trainer = MetricsWriter(str(run))  # no config: follows the run's metrics/ directory
    trainer.write("train", step=10, loss=1.5)
    pipeline.event("stage_end", stage="train")
    pipeline.close()
    trainer.close()
    assert len(list((run / "metrics").glob("*.jsonl"))) == 2
    assert (run / "metrics.jsonl").read_text() == json.dumps(older) + "\n"  # never appended to again
    df = load_metrics(str(run))
    assert df["kind"].tolist() == ["train", "event", "train", "event"]
    assert df["step"].tolist()[::2] == [5, 10]
    assert main(["metrics", str(run), "--kind", "train", "--csv"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 3 and rows[1].split(",")[:2] == ["train", "5"] and rows[2].split(",")[:2] == ["train", "10"]


MOUNTS = r"""/dev/vda1 / ext4 rw,relatime 0 0
10.0.0.2:/export /mnt/shared nfs4 rw,vers=4.1 0 0
/dev/vdb /mnt/shared/scratch ext4 rw 0 0
bucket /mnt/gcs fuse.gcsfuse rw 0 0
//files/team /mnt/my\040team cifs rw 0 0
"""


@pytest.mark.parametrize("path, kind, unsafe", [
    ("/home/me/runs/a", "ext4", False),
    ("/mnt/shared/runs/a", "nfs4", True),
    ("/mnt/shared/scratch/runs/a", "ext4", False),  # the deeper mount decides
    ("/mnt/sharedother/a", "ext4", False),  # a prefix of the name is not a mount above it
    ("/mnt/gcs/run", "fuse.gcsfuse", True),
    ("/mnt/my team/run", "cifs", True),  # the kernel's \040 for a space
])
def test_runs_on_network_filesystems_write_a_file_per_writer(path, kind, unsafe):
    from tpu_ray.metrics_stream import appends_unsafe, filesystem_type

    assert filesystem_type(path, MOUNTS) == kind
    assert appends_unsafe(path, MOUNTS) is unsafe


def test_metrics_link_is_refused_not_followed(tmp_path):
    from tpu_ray import storage
    from tpu_ray.train.metrics import MetricsWriter

    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(victim)
    writer = MetricsWriter(str(run), tensorboard=False)
    with pytest.raises(storage.StorageError, match="metrics.jsonl: is a symbolic link"):
        writer.event("stage_start", stage="x")
    assert victim.read_text() == "mine\n"
