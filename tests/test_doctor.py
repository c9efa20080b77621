"""`tpu-ray doctor`: each planted failure is reported as a FAIL naming it; a clean tiny run passes.

Runs use a real tokenizer, real TFRecord shards and manifest (written by shards.py's own functions,
in-process, so no Ray cluster is needed) and a real tiny TF model. Only the clean run and the XLA
tests compile; the data/config checks run with xla=False to keep the file fast.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import tiny_config
from tpu_ray.config import RunConfig
from tpu_ray.doctor.checks import FAIL, PASS, WARN, run_doctor, xla_probe
from tpu_ray.doctor.program import unsupported_ops
from tpu_ray.doctor.targets import parse_target
from tpu_ray.errors import UserError


def prepared_run(run_dir: Path, corpus: Path, tokenizer_dir: str, **overrides):
    """A run directory with the tokenizer and committed shards + manifest, like `tpu-ray shard` leaves."""
    from tpu_ray.prepare.corpus import plan_units
    from tpu_ray.pipeline import shard_job
    from tpu_ray.prepare.shards import process_unit, shard_set
    from tpu_ray.prepare.tokenizer import describe, load_tokenizer_json

    shutil.copytree(tokenizer_dir, run_dir / "tokenizer")
    cfg = tiny_config(run_dir, corpus, **overrides)
    text = load_tokenizer_json(cfg.tokenizer_dir)
    info = describe(text, cfg.tokenizer_dir)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(text)
    units = plan_units(cfg.corpus, cfg.shard, cfg.run_dir)
    (run_dir / "shards").mkdir(parents=True, exist_ok=True)
    results = {u.index: process_unit(u, tok, info, cfg.shard.seq_len, cfg.shards_dir) for u in units}
    shard_set(shard_job(cfg), info, units, results, complete=True).write()
    return cfg


def manifest_of(cfg) -> dict:
    return json.loads((Path(cfg.shards_dir) / "manifest.json").read_text())


def write_manifest(cfg, manifest: dict) -> None:
    (Path(cfg.shards_dir) / "manifest.json").write_text(json.dumps(manifest))


def doctor(cfg, target: str = "v4-8", xla: bool = False, **kwargs) -> tuple[int, dict[str, tuple[str, str]]]:
    """Run the doctor; returns (exit code, {check: (status, evidence + fix)})."""
    out = io.StringIO()
    code = run_doctor(cfg, target=target, out=out, xla=xla, **kwargs)
    checks: dict[str, tuple[str, str]] = {}
    last = None
    for line in out.getvalue().splitlines():
        status = line[:4]
        if status in (PASS, WARN, FAIL):
            last = line[6:21].strip()
            checks[last] = (status, line[21:].strip())
        elif last and line.strip().startswith("fix:"):
            checks[last] = (checks[last][0], checks[last][1] + " " + line.strip())
    return code, checks


@pytest.fixture()
def run(tmp_path, small_corpus, tiny_tokenizer_dir):
    return prepared_run(tmp_path / "run", small_corpus, tiny_tokenizer_dir)


@pytest.mark.slow  # about 1-2 minutes on 2 cores: the slow set (CI runs it too)
def test_clean_tiny_run_passes_with_xla(run):
    # One encoder layer: what is asserted is the program's shape (replicas, precision, the loop, the
    # per-replica batch), which the layer count does not change; XLA's compile grows with the layers.
    code, checks = doctor(run.override({"model.num_hidden_layers": 1}), "v4-8", xla=True)
    assert code == 0, checks
    assert not [c for c, (s, _) in checks.items() if s == FAIL]
    for name in ("config", "tokenizer", "positions", "vocab", "manifest/tok", "data reach", "shards",
                 "batch/replicas", "static shapes", "xla compile", "memory", "capacity plan"):
        assert checks[name][0] == PASS, (name, checks[name])
    assert "traced once" in checks["xla compile"][1] and "the run's shards" in checks["xla compile"][1]
    # The program a v4-8 runs: 4 replicas (4 logical CPUs), bfloat16, TPU's 64 steps per execution,
    # per-replica batch 16 / 4 = 4, and doctor says exactly that.
    assert ("v4-8 program: 4 replica(s) as 4 logical CPU device(s), mixed_bfloat16, steps_per_execution=64 "
            "(one compiled loop, run here with n=2), per-replica batch [4, 64], forward+backward under XLA"
            in checks["xla compile"][1]), checks["xla compile"]
    assert "[4, 64]" in checks["static shapes"][1]  # 16 over 4 replicas
    assert "chip-hours" in checks["capacity plan"][1]


@pytest.mark.quick
def test_unprepared_run_warns_not_prepared(tmp_path, small_corpus):
    cfg = tiny_config(tmp_path / "empty", small_corpus)
    code, checks = doctor(cfg)
    assert code == 0
    assert checks["tokenizer"][0] == WARN and "not prepared yet" in checks["tokenizer"][1]
    assert checks["shards"][0] == WARN and "not prepared yet" in checks["shards"][1]
    assert checks["static shapes"][0] == PASS  # built on synthetic shards


@pytest.mark.quick
def test_seq_len_beyond_positions_fails(tmp_path, small_corpus):
    # The config validator refuses it; the doctor reports that as a FAIL instead of dying.
    code, checks = doctor(lambda: tiny_config(tmp_path, small_corpus, **{"model.max_position_embeddings": 40}))
    assert code == 1
    assert checks["config"][0] == FAIL and "max_position_embeddings >= 66" in checks["config"][1]
    # A config built without validation still meets the doctor's own positions check.
    good = tiny_config(tmp_path, small_corpus)
    raw = RunConfig.model_construct(**{**dict(good), "model": good.model.model_copy(
        update={"max_position_embeddings": 40})})
    code, checks = doctor(raw)
    assert code == 1 and checks["positions"][0] == FAIL
    assert "needs 66 position embeddings" in checks["positions"][1] and "fix:" in checks["positions"][1]


@pytest.mark.quick
def test_quickstart_with_huge_seq_len_fails_on_memory():
    cfg = RunConfig.from_yaml("jobs/configs/quickstart.yaml").override({"shard.seq_len": 100000,
                                                                        "model.max_position_embeddings": 100002,
                                                                        "output_dir": "/nonexistent/doctor"})
    code, checks = doctor(cfg, "v4-8", xla=True)  # xla=True: the probe must skip, not try 100k tokens
    assert code == 1
    assert checks["memory"][0] == FAIL and "of 32.0 GB" in checks["memory"][1]
    assert checks["xla compile"][0] == WARN and "skipped" in checks["xla compile"][1]


def test_batch_not_divisible_by_target_replicas(run):
    code, checks = doctor(run.override({"train.batch_size": 18}), "v3-8")
    assert code == 1
    status, text = checks["batch/replicas"]
    assert status == FAIL and "train.batch_size=18" in text and "8 replicas" in text and "batch_size=24" in text


def test_local_shards_fail_on_tpu_node_but_pass_on_tpu_vm(run):
    code, checks = doctor(run, "v3-8-node")
    assert code == 1
    assert checks["data reach"][0] == FAIL and "TPU Node" in checks["data reach"][1]
    assert "gs://" in checks["data reach"][1]
    code, checks = doctor(run, "v3-8")
    assert code == 0 and checks["data reach"][0] == PASS


def test_shard_checksum_mismatch_is_named(run):
    manifest = manifest_of(run)
    entry = manifest["splits"]["train"]["shards"][0]
    path = Path(run.shards_dir) / entry["path"]
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF  # same size, different bytes
    path.write_bytes(bytes(data))
    code, checks = doctor(run)
    assert code == 1
    assert checks["shards"][0] == FAIL and entry["path"] in checks["shards"][1] and "sha256" in checks["shards"][1]


def test_truncated_shard_is_named(run):
    entry = manifest_of(run)["splits"]["train"]["shards"][1]
    path = Path(run.shards_dir) / entry["path"]
    path.write_bytes(path.read_bytes()[:-10])
    code, checks = doctor(run)
    assert code == 1 and checks["shards"][0] == FAIL and entry["path"] in checks["shards"][1]
    assert "truncated" in checks["shards"][1]


def test_full_checksums_an_unsampled_shard(run):
    entry = manifest_of(run)["splits"]["train"]["shards"][1]  # not first, middle or last: --full reads it
    path = Path(run.shards_dir) / entry["path"]
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    code, checks = doctor(run, full=True)
    assert code == 1 and checks["shards"][0] == FAIL and entry["path"] in checks["shards"][1]


def test_manifest_from_another_tokenizer(tmp_path, small_corpus, tiny_tokenizer_dir):
    from tpu_ray.config import TokenizerConfig
    from tpu_ray.prepare.tokenizer import save_tokenizer, train_tokenizer

    other = tmp_path / "other-tok"
    lines = [s for s in small_corpus.read_text().splitlines()[:2000] if s.strip()]
    save_tokenizer(train_tokenizer([lines], TokenizerConfig(vocab_size=300)), str(other), 64)
    cfg = prepared_run(tmp_path / "run", small_corpus, str(other))  # shards made with the other one
    cfg = cfg.override({"tokenizer.path": tiny_tokenizer_dir})
    code, checks = doctor(cfg)
    assert code == 1
    assert checks["manifest/tok"][0] == FAIL and "manifest.json: shards were made with tokenizer" in checks["manifest/tok"][1]
    assert checks["vocab"][0] == FAIL and "vocab_size 300" in checks["vocab"][1]


def test_shards_with_ids_beyond_the_vocab(run):
    from tpu_ray.prepare.tfrecord import serialize_examples, write_records

    manifest = manifest_of(run)
    entry = manifest["splits"]["train"]["shards"][0]
    rows = np.random.default_rng(0).integers(5, 2000, size=(entry["samples"], 64))
    buf = io.BytesIO()
    write_records(buf, serialize_examples(rows))
    data = buf.getvalue()
    (Path(run.shards_dir) / entry["path"]).write_bytes(data)
    entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())  # a consistent but wrong shard
    write_manifest(run, manifest)
    code, checks = doctor(run)
    assert code == 1
    assert checks["vocab"][0] == FAIL and "shards hold token id" in checks["vocab"][1]
    assert ">= vocab_size 800" in checks["vocab"][1]


@pytest.mark.quick
def test_op_xla_cannot_compile_is_named():
    import tensorflow as tf

    def factory():
        def step(batch):
            text = tf.strings.as_string(batch["input_ids"])  # a string op: no XLA kernel
            return tf.reduce_sum(tf.strings.length(text))
        return step

    batches = iter([{"input_ids": tf.ones([2, 8], tf.int32)}] * 2)
    status, evidence, fix = xla_probe(factory, batches)
    assert status == FAIL and "AsString" in evidence and "test_doctor.py" in evidence and fix


@pytest.mark.quick
def test_retracing_step_is_reported():
    import tensorflow as tf

    def factory():
        return lambda batch: tf.reduce_sum(batch["input_ids"])

    batches = iter([{"input_ids": tf.ones([2, 8], tf.int32)}, {"input_ids": tf.ones([3, 8], tf.int32)}])
    status, evidence, _ = xla_probe(factory, batches)
    assert status == FAIL and "traced 2 times" in evidence


@pytest.mark.quick
def test_op_name_extraction_from_xla_messages():
    msg = ("Detected unsupported operations when trying to compile graph __inference_step_7 on XLA_CPU_JIT: "
           "EagerPyFunc (No registered 'EagerPyFunc' OpKernel for XLA_CPU_JIT devices compatible with node "
           "{{node EagerPyFunc}}){{node EagerPyFunc}}")
    assert unsupported_ops(msg) == ["EagerPyFunc"]


@pytest.mark.parametrize("name,replicas,style,chips", [
    ("v2-8", 8, "tpu-vm", 4), ("v3-8-node", 8, "tpu-node", 4), ("v4-8", 4, "tpu-vm", 4),
    ("v4-32", 16, "tpu-vm", 16), ("v5e-8", 8, "tpu-vm", 8), ("v5litepod-8", 8, "tpu-vm", 8),
    ("v5p-8", 4, "tpu-vm", 4), ("a100", 1, "gpu", 1), ("h100-8", 8, "gpu", 8),
])
@pytest.mark.quick
def test_target_table(name, replicas, style, chips):
    t = parse_target(name, RunConfig().train)
    assert (t.replicas, t.style, t.chips) == (replicas, style, chips) and t.peak and t.hbm_bytes > 0


@pytest.mark.parametrize("name", ["v9-8", "v4-8-node", "v4-12"])
@pytest.mark.quick
def test_unknown_or_impossible_targets_are_usage_errors(name):
    with pytest.raises(UserError, match=f"--target {name}"):
        parse_target(name, RunConfig().train)


@pytest.mark.quick
def test_binary_corpus_fails_before_sharding(tmp_path, small_corpus):
    blob = tmp_path / "weights.txt"
    blob.write_bytes(b"\x00\x01" * 4096)
    code, checks = doctor(tiny_config(tmp_path / "run", small_corpus).override({"corpus.source": str(blob)}))
    assert code == 1 and checks["corpus"][0] == FAIL and "weights.txt: byte 0: NUL byte" in checks["corpus"][1]


@pytest.mark.quick
def test_cli_doctor_exit_codes(tmp_path, capsys):
    from tpu_ray.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("shard:\n  seq_len: 512\nmodel:\n  max_position_embeddings: 256\n")
    assert main(["doctor", "--config", str(bad), "--target", "v4-8"]) == 1  # a bad config is a FAIL check
    out = capsys.readouterr().out
    assert "FAIL  config" in out and "max_position_embeddings >= 514" in out
    good = tmp_path / "good.yaml"
    good.write_text("name: t\n")
    assert main(["doctor", "--config", str(good), "--target", "v7-8"]) == 2  # an unknown target: usage error
    assert "tpu-ray: error: --target v7-8: unknown accelerator" in capsys.readouterr().err


def test_gs_run_on_tpu_node_and_missing_bucket(gcs_emulator, tmp_path, small_corpus, tiny_tokenizer_dir):
    from tpu_ray import storage

    local = prepared_run(tmp_path / "run", small_corpus, tiny_tokenizer_dir)
    remote = gcs_emulator.make_bucket() + "/run"
    for path in sorted(p for p in (tmp_path / "run").rglob("*") if p.is_file()):
        storage.atomic_copy_file(str(path), f"{remote}/{path.relative_to(tmp_path / 'run')}")
    cfg = local.override({"output_dir": remote})
    code, checks = doctor(cfg, "v3-8-node")
    assert code == 0, checks
    assert checks["data reach"][0] == PASS and checks["shards"][0] == PASS and checks["vocab"][0] == PASS
    code, checks = doctor(cfg.override({"output_dir": "gs://no-such-bucket-doctor/run"}), "v3-8-node")
    assert code == 1 and checks["tokenizer"][0] == FAIL
    assert "bucket 'no-such-bucket-doctor' does not exist" in checks["data reach"][1]


def test_doctor_checks_every_shard_that_training_checks(run):
    """Doctor once sampled 3 shards and passed a flipped byte that training refuses. Under
    training's size bound every shard is hashed, by both."""
    from tpu_ray.prepare.shard_set import ShardSet

    entries = ShardSet.load(run.shards_dir).entries
    assert len(entries) > 3  # more shards than a sample of first, middle and last
    entry = manifest_of(run)["splits"]["train"]["shards"][1]  # not first, middle or last
    path = Path(run.shards_dir) / entry["path"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    code, checks = doctor(run)  # no --full
    assert code == 1 and checks["shards"][0] == FAIL and entry["path"] in checks["shards"][1]
    assert "sha256" in checks["shards"][1]


def test_doctor_prints_the_plan_one_row_per_span():
    import io

    from tpu_ray.doctor.checks import run_doctor

    cfg = RunConfig.from_yaml("jobs/configs/quickstart.yaml").override({
        "output_dir": "/nonexistent/doctor-plan", "train.steps": 100,
        "train.phases": [{"steps": 90, "seq_len": 64}, {"steps": 10, "seq_len": 128}]})
    out = io.StringIO()
    run_doctor(cfg, "v4-8", out=out, xla=False)
    rows = [line for line in out.getvalue().splitlines() if line.startswith("PASS  plan ")]
    assert len(rows) == 3, out.getvalue()
    assert "steps 1-90 at seq_len 64" in rows[1] and "left unread" in rows[2]


@pytest.mark.quick
def test_a_hub_corpus_it_did_not_fetch_is_warn_not_checked(tmp_path, small_corpus):
    """Doctor printed PASS for `hf:wikitext ... (loaded by the tokenizer/shard stages, not here)`:
    a PASS it never checked. A mixture's file source is still read (PASS), its Hub source WARN."""
    cfg = tiny_config(tmp_path / "run", small_corpus).override(
        {"corpus.source": "hf:wikitext", "corpus.hf_config": "wikitext-2-v1"})
    code, checks = doctor(cfg)
    assert code == 0 and checks["corpus"][0] == WARN, checks["corpus"]
    assert "corpus.source=hf:wikitext: not checked" in checks["corpus"][1], checks["corpus"]
    mixture = RunConfig.from_dict({"output_dir": str(tmp_path / "mix"), "corpus": {"sources": {
        "domain": {"source": str(small_corpus), "weight": 0.9},
        "general": {"source": "hf:wikitext", "hf_config": "wikitext-2-v1", "weight": 0.1}}}})
    out = io.StringIO()
    run_doctor(mixture, target="cpu", out=out, xla=False)
    rows = [r for r in out.getvalue().splitlines() if r[6:21].strip() == "corpus"]
    assert rows[0].startswith(PASS) and f"corpus.sources.domain.source={small_corpus}: 1 file(s)" in rows[0], rows
    assert rows[1].startswith(WARN) and "corpus.sources.general.source=hf:wikitext: not checked" in rows[1], rows


@pytest.mark.quick
def test_a_branch_is_checked_on_its_stable_runs_shards_and_tokenizer(tmp_path, small_corpus):
    """A branch names no shard.dir or tokenizer.path: doctor checks the stable run's (what the
    branch reads), not the branch's empty directory (a FAIL "this run has no shards" before)."""
    from tests.helpers import stable_run_and_branch

    _stable, branch = stable_run_and_branch(tmp_path, small_corpus)
    _code, checks = doctor(branch, target="cpu")
    assert checks["branch"][0] == PASS and "from " in checks["branch"][1], checks["branch"]
