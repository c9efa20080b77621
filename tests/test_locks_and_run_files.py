"""Nothing lost, no one let in: locks and run files that cannot be turned against their
user, one writer per shard directory, gs:// locks owned by a token with a lease, working dependency
floors, whole exports, confined index paths and no credentials in a run's files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tpu_ray.errors import UserError


# --- 1. locks and run files never follow links; run directories must be ours ------------------
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


@pytest.mark.quick
def test_report_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    from tpu_ray.report import write_report
    from tpu_ray.train.metrics import MetricsWriter

    run = tmp_path / "run"
    run.mkdir()
    writer = MetricsWriter(str(run), tensorboard=False)
    for step in (1, 2):
        writer.write("train", step=step, loss=5.0 / step, lr=1e-3, samples_per_s=10.0, tokens_per_s=100.0)
    victim = tmp_path / "victim.html"
    victim.write_text("mine\n")
    (run / "report.html").symlink_to(victim)
    (run / "loss.png").symlink_to(victim)
    write_report(str(run))
    assert victim.read_text() == "mine\n"
    assert not (run / "report.html").is_symlink() and "<html" in (run / "report.html").read_text()
    assert not (run / "loss.png").is_symlink()


@pytest.mark.quick
def test_docs_and_help_suggest_no_shared_tmp_output_dir():
    """`--output-dir /tmp/quickstart` on a shared machine is a directory anyone can create first."""
    pattern = re.compile(r"/tmp/[A-Za-z0-9_.-]+")
    files = [REPO / "README.md", REPO / "tpu_ray" / "cli.py", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "jobs").rglob("*.py")), *sorted((REPO / "jobs").rglob("*.yaml"))]
    found = [f"{p.relative_to(REPO)}: {m}" for p in files for m in pattern.findall(p.read_text())]
    assert not found, found
    out = subprocess.run([sys.executable, "-m", "tpu_ray.cli", "--help"], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and "runs/quickstart" in out.stdout and "/tmp/" not in out.stdout


# --- 4. gs:// lock: a token and a lease, not host and pid --------------------------------------
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


# --- 2. one writer per shard directory; another run's shards are only read -----------------------
class _Stop(Exception):
    pass


def test_a_run_sharding_into_its_default_dir_locks_it_against_another_run(tmp_path, small_corpus,
                                                                          tiny_tokenizer_dir, ray_local,
                                                                          monkeypatch):
    """Run A shards into RUN_A/shards; run B reusing them (shard.dir=RUN_A/shards) used to hold only
    its own locks, so its clean-up or discard ran beside A's writers."""
    from tests.helpers import tiny_config
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.prepare import shards as shards_mod

    cfg_a = tiny_config(tmp_path / "a", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir})
    cfg_b = tiny_config(tmp_path / "b", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir,
                                                          "shard.dir": cfg_a.shards_dir})
    refused = []

    def while_a_shards(job, *args, **kwargs):
        if job.paths.run_dir == cfg_a.run_dir:  # A is in its shard stage: B must not get in
            with pytest.raises(UserError, match=rf"{cfg_a.shards_dir}: in use by .*tpu-ray shard") as err:
                Pipeline(cfg_b).shard()
            refused.append(str(err.value))
        raise _Stop

    monkeypatch.setattr(shards_mod, "make_shards", while_a_shards)
    with pytest.raises(_Stop):
        Pipeline(cfg_a).shard()
    assert len(refused) == 1 and "\n" not in refused[0]


def test_another_runs_shards_are_never_cleaned_or_discarded(tmp_path, small_corpus, tiny_tokenizer_dir,
                                                            ray_local):
    from tests.helpers import tiny_config
    from tpu_ray.prepare.shard_set import ShardSet
    from tpu_ray.prepare.shards import make_shards
    from tpu_ray.pipeline import shard_job

    cfg_a = tiny_config(tmp_path / "a", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir})
    make_shards(shard_job(cfg_a))
    shards = tmp_path / "a" / "shards"
    manifest = ShardSet.load(str(shards))
    files = sorted(p for p in shards.rglob("*.tfrecord"))
    # A run that reads A's finished shards with A's settings reuses them and writes nothing there
    # (A's in-flight temp file stays, the manifest still names A).
    (shards / "train" / ".tmp-train-00009-1.tfrecord.abc.tmp").write_bytes(b"A writes this")
    before = (shards / "manifest.json").read_bytes()
    cfg_b = tiny_config(tmp_path / "b", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir,
                                                          "shard.dir": str(shards)})
    summary = make_shards(shard_job(cfg_b))
    assert (shards / "train" / ".tmp-train-00009-1.tfrecord.abc.tmp").exists()
    assert summary.skipped_units == summary.units and (shards / "manifest.json").read_bytes() == before
    assert "owner" not in json.loads(before)  # RUN_A/shards is RUN_A's: the same bytes wherever RUN_A is
    # Another seq_len over A's unfinished shards: refused naming A, nothing deleted.
    manifest.complete = False
    manifest.write()
    cfg_c = cfg_b.override({"shard.seq_len": 32})
    with pytest.raises(UserError, match=rf"belong to run {cfg_a.run_dir} and were made from another") as err:
        make_shards(shard_job(cfg_c))
    assert "\n" not in str(err.value)
    assert sorted(p for p in shards.rglob("*.tfrecord")) == files and (shards / "manifest.json").exists()
    # With A's settings but unfinished: also A's to finish, not B's.
    with pytest.raises(UserError, match=rf"belong to run {cfg_a.run_dir} and are unfinished"):
        make_shards(shard_job(cfg_b))
    assert sorted(p for p in shards.rglob("*.tfrecord")) == files


# --- 5. dependency floors that work ---------------------------------------------------------------
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


# --- 6. the export (and the tokenizer) replaced whole; another config's export needs --force ----
def _export_dir(path, weights: bytes, config: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "tf_model.h5").write_bytes(weights)
    (path / "model.safetensors").write_bytes(weights)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.quick
def test_export_cut_mid_way_leaves_the_old_model_whole(tmp_path):
    """The old export was copied over file by file: a crash left tf_model.h5 of one model beside
    model.safetensors of another under an old config.json that said "complete"."""
    from tpu_ray import storage

    model = tmp_path / "run" / "model"
    _export_dir(model, b"old weights", {"model_type": "roberta"})
    new = tmp_path / "new"
    _export_dir(new, b"new weights", {"model_type": "roberta"})
    (new / "tokenizer.json").mkdir()  # cannot be copied: the commit fails after the weights
    with pytest.raises(IsADirectoryError):
        storage.commit_dir(str(new), str(model), last="config.json")
    assert (model / "tf_model.h5").read_bytes() == b"old weights"
    assert (model / "model.safetensors").read_bytes() == b"old weights"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model"]  # no temp left beside it
    (new / "tokenizer.json").rmdir()
    (model / "stale.bin").write_bytes(b"from the old export")
    storage.commit_dir(str(new), str(model), last="config.json")
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors", "tf_model.h5"]
    assert (model / "tf_model.h5").read_bytes() == b"new weights"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model"]


@pytest.mark.quick
def test_export_on_gcs_is_marked_incomplete_while_it_is_replaced(gcs_emulator, tmp_path):
    from tpu_ray import storage

    model = f"{gcs_emulator.make_bucket()}/run/model"
    old = tmp_path / "old"
    _export_dir(old, b"old", {"v": 1})
    (old / "stale.bin").write_bytes(b"x")
    storage.commit_dir(str(old), model, last="config.json")
    new = tmp_path / "new"
    _export_dir(new, b"new", {"v": 2})
    storage.commit_dir(str(new), model, last="config.json")
    assert sorted(storage.find_sizes(model)) == ["config.json", "model.safetensors", "tf_model.h5"]
    assert storage.read_bytes(f"{model}/tf_model.h5") == b"new"


@pytest.mark.quick
def test_replacing_an_export_of_another_config_or_checkpoint_needs_force(tmp_path, small_corpus, capsys):
    """A rerun with another config after deleting checkpoints/ replaced RUN/model silently."""
    from tests.helpers import tiny_config
    from tpu_ray.cli import main
    from tpu_ray.train.export import PROVENANCE_KEY, config_digest, refuse_replacing_export

    cfg = tiny_config(tmp_path / "run", small_corpus)
    model = tmp_path / "run" / "model"
    _export_dir(model, b"w", {PROVENANCE_KEY: {"config_sha256": "0" * 64, "step": 20}})
    with pytest.raises(UserError, match=r"model: an exported model made from another config is there; pass --force"):
        refuse_replacing_export(config_digest(cfg.fingerprint()), cfg.run_dir, force=False)
    refuse_replacing_export(config_digest(cfg.fingerprint()), cfg.run_dir, force=True)
    # Same config, but no checkpoint continues it (checkpoints/ deleted): another checkpoint chain.
    _export_dir(model, b"w", {PROVENANCE_KEY: {"config_sha256": config_digest(cfg.fingerprint()), "step": 20}})
    with pytest.raises(UserError, match="from another checkpoint"):
        refuse_replacing_export(config_digest(cfg.fingerprint()), cfg.run_dir, force=False)
    ckpt = tmp_path / "run" / "checkpoints"
    ckpt.mkdir()
    for name in ("ckpt-20.index", "ckpt-20.data-00000-of-00001"):
        (ckpt / name).write_bytes(b"x")
    (ckpt / "checkpoint").write_text('model_checkpoint_path: "ckpt-20"\n')
    refuse_replacing_export(config_digest(cfg.fingerprint()), cfg.run_dir, force=False)  # a resumed run continues its own export
    # The CLI refuses before training, in one line, exit 2.
    _export_dir(model, b"w", {PROVENANCE_KEY: {"config_sha256": "0" * 64, "step": 20}})
    code = main(["train", "--output-dir", str(tmp_path / "run"), "--resume", "model.preset=tiny"])
    err = capsys.readouterr()
    assert code == 2 and (model / "tf_model.h5").read_bytes() == b"w"
    assert "made from another config is there; pass --force" in err.out + err.err


def test_tokenizer_retrain_replaces_the_directory_whole(tmp_path, small_corpus):
    from tpu_ray.config import TokenizerConfig
    from tpu_ray.prepare.tokenizer import save_tokenizer, train_tokenizer

    out = tmp_path / "run" / "tokenizer"
    out.mkdir(parents=True)
    (out / "vocab.txt").write_text("from an older tokenizer\n")  # not written by this one
    lines = [s for s in small_corpus.read_text().splitlines()[:2000] if s.strip()]
    save_tokenizer(train_tokenizer([lines], TokenizerConfig(vocab_size=300)), str(out), 64)
    assert not (out / "vocab.txt").exists() and (out / "tokenizer.json").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["tokenizer"]


# --- 7. index paths inside the model directory; no password of a URL in a run's files ------------
@pytest.mark.quick
def test_safetensors_index_naming_a_file_outside_the_model_dir_is_refused(tmp_path):
    from safetensors.numpy import save_file

    from tpu_ray.train.init_from import Source, _load_safetensors

    import numpy as np

    outside = tmp_path / "elsewhere.safetensors"
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(outside))
    model = tmp_path / "model"
    model.mkdir()
    index = model / "model.safetensors.index.json"
    for name in (str(outside), "../elsewhere.safetensors"):
        index.write_text(json.dumps({"weight_map": {"w": name}}))
        with pytest.raises(UserError, match=r"weight_map names .*not a file of the model directory") as err:
            _load_safetensors(None, str(model / "model.safetensors"), str(index), Source("hf", str(model), str(model)))
        assert "\n" not in str(err.value)
    (model / "link.safetensors").symlink_to(outside)  # a link inside pointing out: also outside
    index.write_text(json.dumps({"weight_map": {"w": "link.safetensors"}}))
    with pytest.raises(UserError, match="not a file of the model directory"):
        _load_safetensors(None, str(model / "model.safetensors"), str(index), Source("hf", str(model), str(model)))


@pytest.mark.quick
def test_redact_keeps_the_user_and_hides_the_password():
    from tpu_ray.redact import redact, redact_obj, unredact

    assert redact("https://alice:s3cr3t@host/a.txt") == "https://alice:***@host/a.txt"
    assert redact("corpus https://TOKEN@github.com/x and gs://bucket/o@1") == \
        "corpus https://***@github.com/x and gs://bucket/o@1"
    assert redact("mail me@example.com, hf:wikitext") == "mail me@example.com, hf:wikitext"
    assert redact_obj({"a": ["http://u:p@h/x", 1]}) == {"a": ["http://u:***@h/x", 1]}
    assert unredact("read http://u:***@h/x", ["http://u:p@h/x"]) == "read http://u:p@h/x"


@pytest.mark.quick
def test_model_card_never_shows_a_corpus_password(tmp_path):
    from tests.helpers import tiny_config
    from tpu_ray.train.export_safetensors import model_card, run_record

    cfg = tiny_config(tmp_path / "run", "https://alice:s3cr3t@host/corpus.txt")
    card = model_card(run_record(cfg), 10, 800, "roberta")
    assert "s3cr3t" not in card and "https://alice:***@host/corpus.txt" in card


@pytest.fixture
def http_corpus(small_corpus):
    """The small corpus served over HTTP on loopback (credentials in the URL are ignored by it)."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def handle(self):
            try:
                super().handle()
            except (BrokenPipeError, ConnectionResetError):  # a ranged reader closing early
                pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(small_corpus.parent)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://alice:s3cr3t@127.0.0.1:{server.server_address[1]}/{small_corpus.name}"
    server.shutdown()
    server.server_close()


def test_a_password_in_the_corpus_url_is_in_no_file_of_the_run(tmp_path, http_corpus, ray_local, monkeypatch):
    """config.yaml, run_info.json (the command), plan.json, the manifest, summary.json and the
    metrics used to hold `alice:s3cr3t` verbatim; the resumed stage still reads the corpus."""
    from tests.helpers import tiny_config
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.report import write_report

    monkeypatch.setattr(sys, "argv", ["tpu-ray", "prepare", "--corpus", http_corpus])
    cfg = tiny_config(tmp_path / "run", http_corpus)
    Pipeline(cfg).prepare()
    Pipeline(cfg).shard()  # plan.json read back (credentials restored) and the shards reused
    write_report(cfg.run_dir)
    leaked = [str(p.relative_to(tmp_path)) for p in (tmp_path / "run").rglob("*")
              if p.is_file() and b"s3cr3t" in p.read_bytes()]
    assert not leaked, leaked
    assert "http://alice:***@127.0.0.1" in (tmp_path / "run" / "config.yaml").read_text()
    assert "alice:***@" in json.loads((tmp_path / "run" / "run_info.json").read_text())["command"]
