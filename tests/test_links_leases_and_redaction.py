"""Nothing lost, no one let in, through links, leases and credentials: a run's records cannot
write outside it, a borrowed shard set stays its owner's, no open port without saying so, private run
directories checked without following links, one redaction for every file, log and error line,
a lost gs:// lock stops its writer, a model directory's links are not followed, and `compare`
commits its files by rename."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tpu_ray.errors import DamagedRunDir, UserError


# --- 5. one redaction for files, logs and error lines --------------------------------------------
@pytest.mark.quick
@pytest.mark.parametrize("url, secret", [
    ("https://alice:pa'ss@host/a.txt", "pa'ss"),
    ('https://alice:pa"ss@host/a.txt', 'pa"ss'),
    ("https://alice:p@ssw0rd@host/a.txt", "ssw0rd"),
    ("https://storage.googleapis.com/b/o.txt?X-Goog-Algorithm=GOOG4&X-Goog-Signature=abc123def&x=1", "abc123def"),
    ("https://host/o.txt?token=hf_tok3n", "hf_tok3n"),
    ("https://acct.blob.core.windows.net/c/o.txt?sv=2020&sig=S1GNED", "S1GNED"),
])
def test_redaction_hides_quoted_at_signed_and_token_credentials_in_every_form(url, secret):
    """Quotes made the old pattern skip the URL, `@` leaked the part after it, query tokens were
    never hidden; YAML (config.yaml) and JSON (run_info.json, plan.json) forms included."""
    import yaml

    from tpu_ray.redact import redact, unredact

    for form in (url, yaml.safe_dump({"corpus": url}), json.dumps({"command": f"tpu-ray run {url}"}), repr(url)):
        assert secret not in redact(form), form
    plan = redact(json.dumps({"files": [url]}))
    assert json.loads(unredact(plan, [url]))["files"] == [url]  # the plan still opens the real URL


@pytest.mark.quick
def test_log_lines_and_the_cli_error_line_keep_no_password(tmp_path, capsys):
    """`tpu-ray shard --corpus https://user:secret@127.0.0.1:9/x.txt` printed `user:secret`."""
    from tpu_ray.cli import main
    from tpu_ray.logs import setup_logging

    setup_logging()
    logging.getLogger("tpu_ray.test").warning("reading %s", "https://bob:hunter2@host/x?X-Goog-Signature=ff00")
    code = main(["shard", "--corpus", "https://user:secret@127.0.0.1:9/x.txt", "--output-dir", str(tmp_path / "r"),
                 "ray.address=local"])
    err = capsys.readouterr().err
    assert code in (1, 2) and "tpu-ray: error:" in err, err
    assert "user:***@127.0.0.1" in err or "127.0.0.1:9" in err, err
    assert "secret" not in err and "hunter2" not in err and "ff00" not in err, err


# --- 4. the run-directory privacy check: no link, a parent of ours ----------------------------
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


# --- 8. `tpu-ray compare` commits its files by rename ------------------------------------------
@pytest.mark.quick
def test_compare_replaces_a_planted_link_in_out_instead_of_writing_through_it(tmp_path):
    """A `compare_loss.png` link planted in --out turned its target file into a PNG."""
    from tests.test_compare import BASE, _run
    from tpu_ray.comparison import PAGE, PLOTS, write_comparison

    runs = [_run(tmp_path / "a", BASE, "set1"), _run(tmp_path / "b", BASE, "set1", scale=0.9)]
    out = tmp_path / "out"
    out.mkdir()
    victims = {}
    for name in (*PLOTS, PAGE):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text("keep me\n")
        (out / name).symlink_to(victims[name])
    paths = write_comparison(runs, str(out))
    for name, victim in victims.items():
        assert victim.read_text() == "keep me\n", name
        assert not os.path.islink(paths[name]) and os.path.getsize(paths[name]) > 100


# --- 1. a run's records name nothing outside it -------------------------------------------------
def _planted_init_record(run: str, files: dict[str, str], sha: str) -> None:
    """RUN/init/source.json as whoever can write the run's gs:// folder would edit it."""
    from tpu_ray import storage

    storage.atomic_write_text(f"{run}/config.yaml", "name: t\n")
    storage.atomic_write_text(f"{run}/init/source.json", json.dumps(
        {"source": "/models/base", "kind": "hf", "resolved": "/models/base", "sha256": sha, "files": files}))


@pytest.mark.quick
@pytest.mark.parametrize("key, sha", [
    ("../../../../escaped.txt", "a" * 64),  # a `files` key that climbs out of the staging directory
    ("config.json", "../../../../escaped-dir"),  # the record's sha256 used as the cache folder's name
])
def test_a_planted_init_record_writes_nothing_outside_the_cache(gcs_emulator, tmp_path, monkeypatch, key, sha):
    """The next host staging RUN/init from gs:// downloaded each `files` key to `tmp / key`."""
    import hashlib

    from tpu_ray.train.init_from import _copy_source, read_record

    cache = tmp_path / "home" / "a" / "b" / "c"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    run = f"{gcs_emulator.make_bucket()}/run"
    payload = b"echo pwned\n"
    _planted_init_record(run, {key: hashlib.sha256(payload).hexdigest()}, sha)
    before = {p for p in tmp_path.rglob("*") if "tpu-ray" not in p.parts}
    with pytest.raises(DamagedRunDir, match=r"init/source\.json: .*(names '\.\./|not the record)") as err:
        _copy_source(run, read_record(run))
    assert "\n" not in str(err.value)
    assert {p for p in tmp_path.rglob("*") if "tpu-ray" not in p.parts} == before


# --- 7. a local init_from directory's links stay inside it --------------------------------------
@pytest.mark.quick
def test_a_model_directory_link_to_a_file_outside_is_refused_not_copied(tmp_path):
    """A cloned model repository shipping `vocab.txt -> ~/.netrc` put that file into RUN/init and
    from there into RUN/model (which the card says to publish)."""
    from tests.helpers import tiny_config
    from tpu_ray.train.init_from import own_copy

    netrc = tmp_path / "netrc"
    netrc.write_text("machine host login alice password s3cr3t\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (model / "tf_model.h5").write_bytes(b"weights")
    (model / "tokenizer.json").write_text("{}")
    (model / "vocab.txt").symlink_to(netrc)
    (model / "special_tokens_map.json").symlink_to("tokenizer.json")  # a link inside the directory is fine
    cfg = tiny_config(tmp_path / "run", tmp_path / "corpus.txt", **{"model.init_from": str(model)})
    with pytest.raises(UserError, match=r"model: vocab\.txt is a link to .*netrc, outside the model directory") as e:
        own_copy(cfg.init_spec)
    assert "\n" not in str(e.value)
    leaked = [p for p in (tmp_path / "run").rglob("*") if p.is_file() and b"s3cr3t" in p.read_bytes()]
    assert not leaked
    (model / "vocab.txt").unlink()
    (model / "vocab.txt").write_text("[PAD]\n")
    own_copy(cfg.init_spec)
    assert (tmp_path / "run" / "init" / "special_tokens_map.json").read_text() == "{}"


# --- 6. a lost gs:// lock stops its writer -------------------------------------------------------
@pytest.mark.quick
def test_after_the_lock_is_taken_over_the_old_writer_writes_nothing_more(gcs_emulator):
    """`lost` was set by the renewal and never read: metrics, export and shards went on beside
    the new holder's."""
    from tests.test_locks_and_run_files import Clock
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
    from tests.test_locks_and_run_files import Clock
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
    from tests.test_locks_and_run_files import Clock
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


# --- 2. a borrowed shard set stays its owner's ----------------------------------------------------
def test_a_run_borrowing_a_shard_set_with_a_missing_file_rewrites_nothing_of_it(tmp_path, small_corpus,
                                                                                 tiny_tokenizer_dir, ray_local):
    """With shard.dir=A/shards and one of A's shard files gone, the unit was put back on the
    to-do list, written into A's directory, and A's manifest rewritten as this run's, incomplete."""
    from tests.helpers import tiny_config
    from tpu_ray.prepare.shards import make_shards
    from tpu_ray.pipeline import shard_job

    cfg_a = tiny_config(tmp_path / "a", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir})
    make_shards(shard_job(cfg_a))
    shards = tmp_path / "a" / "shards"
    gone = sorted(shards.rglob("*.tfrecord"))[0]
    gone.unlink()
    before = {p: p.read_bytes() for p in shards.rglob("*") if p.is_file()}
    cfg_b = tiny_config(tmp_path / "b", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir,
                                                          "shard.dir": str(shards)})
    with pytest.raises(UserError, match=rf"belong to run {cfg_a.run_dir} and 1 of their units lost or changed a "
                                        rf"file \(e\.g\. .*{gone.name}\).*tpu-ray shard --output-dir") as err:
        make_shards(shard_job(cfg_b))
    assert "\n" not in str(err.value)
    assert {p: p.read_bytes() for p in shards.rglob("*") if p.is_file()} == before


# --- 3. multi-worker training: TensorFlow's open ports are refused until the network is closed ----
@pytest.mark.quick
def test_multiworker_training_is_refused_until_its_open_ports_are_declared_firewalled(tmp_path, capsys):
    """train.workers>1 started TensorFlow gRPC servers listening on 0.0.0.0 without authentication
    (TensorFlow 2.21 binds every interface whatever TF_CONFIG names: `ss -ltn` shows `*:PORT`)."""
    from tests.helpers import tiny_config
    from tpu_ray.cli import main

    with pytest.raises(UserError, match=r"train\.workers=2: .*gRPC ports on every interface .*no authentication"
                                        r".*train\.workers_network_closed=true") as err:
        tiny_config(tmp_path / "run", tmp_path / "c.txt", **{"train.workers": 2})
    assert "\n" not in str(err.value)
    assert tiny_config(tmp_path / "run", tmp_path / "c.txt",
                       **{"train.workers": 2, "train.workers_network_closed": True}).train.workers == 2
    (tmp_path / "c.txt").write_text("some text\n")
    code = main(["shard", "--corpus", str(tmp_path / "c.txt"), "--output-dir", str(tmp_path / "run"),
                 "train.workers=2", "ray.address=local"])
    assert code == 2 and "train.workers_network_closed=true" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything ran
