"""The bad-input catalogue: every stage and the CLI refuse bad input with ONE line naming the culprit,
exit code 2 from the CLI, and nothing half-written left behind.

Two tables: stage-level (the function a stage calls raises a one-line UserError) and CLI-level
(`tpu_ray.cli.main([...])` in-process: exit code 2, one error line, no partial output).
Real components throughout: real configs and corpora on disk, real TFRecord shards and manifest, a
real tiny TF model for the training rows, the GCS emulator for gs://.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.test_doctor import manifest_of, prepared_run
from tpu_ray.cli import main
from tpu_ray.config import RunConfig, TrainConfig
from tpu_ray.errors import UserError

EVIL = "name: !!python/object/apply:os.system ['touch {marker}']\n"


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------
def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def config_file(tmp: Path, cfg: RunConfig) -> str:
    return str(write(tmp / "cfg.yaml", cfg.to_yaml()))


def truncate_first_train_shard(cfg: RunConfig, keep: float = 0.1) -> str:
    entry = manifest_of(cfg)["splits"]["train"]["shards"][0]
    path = Path(cfg.shards_dir) / entry["path"]
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return entry["path"]


def flip_byte_in_first_train_shard(cfg: RunConfig) -> str:
    entry = manifest_of(cfg)["splits"]["train"]["shards"][0]
    path = Path(cfg.shards_dir) / entry["path"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return entry["path"]


# --------------------------------------------------------------------------------------------
# Stage level
# --------------------------------------------------------------------------------------------
def _plan(corpus: str, tmp: Path):
    from tpu_ray.prepare.corpus import plan_units
    from tpu_ray.prepare.preflight import preflight_corpus

    cfg = RunConfig.from_dict({"corpus": {"source": corpus}, "output_dir": str(tmp / "run")})
    preflight_corpus(cfg.corpus)
    return plan_units(cfg.corpus, cfg.shard, cfg.run_dir)


def _verify_truncated_shard(tmp: Path):
    """A committed shard (as the manifest records it) that lost its tail: training refuses it."""
    import hashlib

    import numpy as np

    from tpu_ray.prepare.tfrecord import serialize_examples, write_records
    from tpu_ray.prepare.shard_set import ShardSet

    path = tmp / "train-00000-4.tfrecord"
    with open(path, "wb") as f:
        write_records(f, serialize_examples(np.full((4, 16), 7)))
    data = path.read_bytes()
    entry = {"path": path.name, "samples": 4, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    path.write_bytes(data[:-5])
    manifest = {"splits": {"train": {"shards": [entry]}, "validation": {"shards": []}}}
    ShardSet.from_json(str(tmp), manifest, str(tmp / "manifest.json")).verify()


STAGES: list[tuple[str, Callable[[Path], object], str]] = [
    ("malformed yaml", lambda t: RunConfig.from_yaml(write(t / "b.yaml", "train:\n  steps: [1, 2\n")),
     "b.yaml: line 3, column 1: malformed YAML"),
    ("unknown key", lambda t: RunConfig.from_dict({"shard": {"seqlen": 64}}),
     "unknown key 'shard.seqlen'; did you mean 'shard.seq_len'?"),
    ("unknown override", lambda t: RunConfig().override(["trian.steps=3"]),
     "no key 'trian' in top level; did you mean 'train'?"),
    ("wrong type", lambda t: RunConfig.from_dict({"train": {"learning_rate": "fast"}}),
     'train.learning_rate="fast"'),
    ("zero size", lambda t: RunConfig.from_dict({"train": {"batch_size": 0}}), "train.batch_size=0"),
    ("negative size", lambda t: RunConfig.from_dict({"shard": {"unit_bytes": -5}}), "shard.unit_bytes=-5"),
    ("missing corpus", lambda t: _plan(str(t / "nope.txt"), t), "nope.txt': no such file or directory"),
    ("empty corpus", lambda t: _plan(str(write(t / "empty.txt", "")), t), "the corpus is empty"),
    ("binary corpus", lambda t: _plan(str(write(t / "model.bin", bytes(range(256)) * 64)), t),
     "model.bin: byte 0: NUL byte, this looks like a binary file"),
    ("truncated tfrecord", _verify_truncated_shard, "train-00000-4.tfrecord: 367 bytes, manifest.json says 372 (truncated"),
    ("tpu on a cpu machine", lambda t: __import__("tpu_ray.train.strategy").train.strategy.select(TrainConfig(strategy="tpu")),
     "run on CPU with train.strategy=cpu"),
]


@pytest.mark.parametrize("name,call,needle", STAGES, ids=[s[0] for s in STAGES])
@pytest.mark.quick
def test_stage_refuses_with_one_line(name, call, needle, tmp_path):
    with pytest.raises(UserError) as err:
        call(tmp_path)
    message = str(err.value)
    assert needle in message
    assert "\n" not in message


@pytest.mark.quick
def test_missing_bucket_is_one_line(gcs_emulator, tmp_path):
    from tpu_ray import storage

    with pytest.raises(UserError) as err:
        storage.read_text("gs://no-such-bucket-xyz/config.yaml")
    assert "bucket 'no-such-bucket-xyz' does not exist" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.quick
def test_safe_loader_executes_nothing(tmp_path):
    marker = tmp_path / "PWNED"
    with pytest.raises(UserError, match="malformed YAML"):
        RunConfig.from_yaml(write(tmp_path / "evil.yaml", EVIL.format(marker=marker)))
    assert not marker.exists()


# --------------------------------------------------------------------------------------------
# CLI level
# --------------------------------------------------------------------------------------------
@dataclass
class Case:
    """argv(tmp, ctx) -> CLI args; `absent` paths (relative to tmp) must not exist afterwards."""

    name: str
    argv: Callable[[Path, dict], list[str]]
    needle: str | Callable[[dict], str]
    absent: list[str] = field(default_factory=list)
    prepared: bool = False  # needs a run directory with tokenizer + shards (ctx["cfg"])
    setup: Callable[[Path, dict], None] | None = None
    only_line: bool = False  # stderr holds nothing but the error line (no library logs/tracebacks)
    fixtures: tuple[str, ...] = ()  # extra pytest fixtures the case needs (e.g. "ray_local")


def _tok(tmp: Path, corpus: str, *extra: str) -> list[str]:
    return ["tokenizer", "--config", str(write(tmp / "c.yaml", "name: t\ntokenizer:\n  vocab_size: 100\n")),
            "--corpus", corpus, "--output-dir", str(tmp / "out"), *extra]


def _train(tmp: Path, ctx: dict, *extra: str) -> list[str]:
    return ["train", "--config", ctx["yaml"], "train.placement=local", *extra]


def _parquet_without_text(tmp: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp / "rows.parquet"
    pq.write_table(pa.table({"body": ["a line of text"] * 20}), path)
    return str(path)


def _dir_where_file(path: Path) -> str:
    path.mkdir(parents=True)
    return str(path)


def _manifest_entry_outside(tmp: Path, ctx: dict) -> None:
    import json

    manifest = manifest_of(ctx["cfg"])
    manifest["splits"]["train"]["shards"][0]["path"] = "../../../../etc/hostname"
    (Path(ctx["cfg"].shards_dir) / "manifest.json").write_text(json.dumps(manifest))


def _other_tokenizer(tmp: Path, ctx: dict) -> None:
    from tpu_ray.config import TokenizerConfig
    from tpu_ray.prepare.tokenizer import save_tokenizer, train_tokenizer

    lines = [s for s in ctx["corpus"].read_text().splitlines()[:1500] if s.strip()]
    save_tokenizer(train_tokenizer([lines], TokenizerConfig(vocab_size=300)), str(tmp / "other-tok"), 64)


def _saved_with_checkpoint(cfg: RunConfig) -> None:
    """The run's config saved and a checkpoint file present: checkpoints pin the whole config
    (before any, a changed batch size simply replaces the saved config: see test_cli_under_faults.py)."""
    from tpu_ray import saved_config
    from tpu_ray.pipeline import versions

    saved_config.save_config(cfg, False, versions())
    write(Path(cfg.run_dir) / "checkpoints" / "ckpt-10.index", b"")


CLI: list[Case] = [
    Case("malformed yaml", lambda t, c: ["tokenizer", "--config", str(write(t / "b.yaml", "a: [1\n")),
                                         "--output-dir", str(t / "out")], "malformed YAML", ["out"]),
    Case("unknown key", lambda t, c: ["tokenizer", "--config", str(write(t / "b.yaml", "train:\n  stepz: 5\n")),
                                      "--output-dir", str(t / "out")],
         "unknown key 'train.stepz'; did you mean 'train.steps'?", ["out"]),
    Case("unknown override", lambda t, c: ["tokenizer", "--output-dir", str(t / "out"), "shard.seqlen=64"],
         "did you mean 'shard.seq_len'?", ["out"]),
    Case("wrong type", lambda t, c: ["tokenizer", "--output-dir", str(t / "out"), "train.steps=many"],
         'train.steps="many"', ["out"]),
    Case("zero size", lambda t, c: ["tokenizer", "--output-dir", str(t / "out"), "train.batch_size=0"],
         "train.batch_size=0", ["out"]),
    Case("negative size", lambda t, c: ["tokenizer", "--output-dir", str(t / "out"), "shard.seq_len=-3"],
         "shard.seq_len=-3", ["out"]),
    Case("missing corpus", lambda t, c: _tok(t, str(t / "nope.txt")), "no such file or directory", ["out"]),
    Case("empty corpus", lambda t, c: _tok(t, str(write(t / "empty.txt", ""))), "the corpus is empty", ["out"]),
    Case("binary corpus", lambda t, c: _tok(t, str(write(t / "blob.txt", b"\x7fELF\x00\x01" * 500))),
         "blob.txt: byte 4: NUL byte", ["out"]),
    Case("missing bucket (corpus)", lambda t, c: _tok(t, "gs://no-such-bucket-1/text.txt"),
         "bucket 'no-such-bucket-1' does not exist", ["out"]),
    Case("missing bucket (output)", lambda t, c: ["tokenizer", "--corpus", str(c["corpus"]), "--output-dir",
                                                  "gs://no-such-bucket-2/run"],
         "bucket 'no-such-bucket-2' does not exist"),
    Case("safe loader", lambda t, c: ["tokenizer", "--config", str(write(t / "e.yaml", EVIL.format(
        marker=t / "PWNED"))), "--output-dir", str(t / "out")], "malformed YAML", ["out", "PWNED"]),
    Case("truncated tfrecord", lambda t, c: _train(t, c), lambda c: f"{c['bad']}: ",
         ["run/checkpoints", "run/model"], prepared=True,
         setup=lambda t, c: c.update(bad=truncate_first_train_shard(c["cfg"]))),
    Case("truncated tfrecord, no manifest", lambda t, c: _train(t, c), lambda c: f"{c['bad']}: truncated or corrupt",
         ["run/checkpoints", "run/model"], prepared=True,
         setup=lambda t, c: c.update(bad=truncate_first_train_shard(c["cfg"])) or
         (Path(c["cfg"].shards_dir) / "manifest.json").unlink()),
    Case("checksum mismatch", lambda t, c: _train(t, c), lambda c: f"{c['bad']}: sha256 ",
         ["run/checkpoints", "run/model"], prepared=True,
         setup=lambda t, c: c.update(bad=flip_byte_in_first_train_shard(c["cfg"]))),
    Case("manifest of another tokenizer", lambda t, c: _train(t, c, f"tokenizer.path={t / 'other-tok'}"),
         "manifest.json: shards were made with tokenizer", ["run/checkpoints", "run/model"], prepared=True,
         setup=_other_tokenizer),
    Case("resume with another config", lambda t, c: ["train", "--resume", "--config", c["yaml"], "train.placement=local",
                                                      "train.batch_size=8"],
         "belongs to a different config (train.batch_size: saved 16, now 8)", ["run/model"], prepared=True,
         setup=lambda t, c: _saved_with_checkpoint(c["cfg"])),
    Case("tpu on a cpu machine", lambda t, c: _train(t, c, "train.strategy=tpu"),
         "train.strategy=tpu: this machine has no TPU", ["run/checkpoints", "run/model"], prepared=True),
    # Files that are not what their option says: once tracebacks
    Case("binary config", lambda t, c: ["tokenizer", "--config", str(write(t / "b.yaml", b"\x7fELF\x02\x01\xd0\xff" * 64)),
                                        "--output-dir", str(t / "out")],
         "b.yaml: byte 6 is not UTF-8 text, this is not a YAML config", ["out"], only_line=True),
    Case("config is a directory", lambda t, c: ["tokenizer", "--config", _dir_where_file(t / "d.yaml"),
                                                "--output-dir", str(t / "out")],
         "d.yaml: is a directory, not a config file", ["out"], only_line=True),
    Case("glob matches only a directory", lambda t, c: _tok(t, (_dir_where_file(t / "texts" / "a.txt"),
                                                               str(t / "texts" / "*"))[1]),
         "only directories match this pattern", ["out"], only_line=True),
    Case("parquet without the text column", lambda t, c: _tok(t, _parquet_without_text(t)),
         "rows.parquet: no column 'text' (columns: body); set corpus.text_field", ["out"], only_line=True),
    Case("output dir is an existing file", lambda t, c: ["tokenizer", "--corpus", str(c["corpus"]), "--output-dir",
                                                         str(write(t / "taken", "x"))],
         "taken: a file is in the way (not a directory)", only_line=True),
    Case("train.steps beyond int64", lambda t, c: ["tokenizer", "--output-dir", str(t / "out"),
                                                   "train.steps=99999999999999999999999"],
         "train.steps=99999999999999999999999: beyond int64", ["out"], only_line=True),
    Case("fill-mask with two masks", lambda t, c: ["fill-mask", "--model", str(write(t / "m" / "config.json", "{}").parent),
                                                   "a [MASK] and a [MASK]"],
         "contains 2 [MASK] tokens; give exactly one", only_line=True),
    Case("metrics pointed at a file", lambda t, c: ["metrics", str(write(t / "metrics.jsonl", "{}\n"))],
         "metrics.jsonl: is a file, not a run directory", only_line=True),
    Case("report --out an existing file", lambda t, c: ["report", str(t / "run"), "--out", str(write(t / "rep", "x"))],
         "rep: --out is an existing file, not a directory", prepared=True, only_line=True),
    Case("unreachable store", lambda t, c: ["tokenizer", "--corpus", str(c["corpus"]), "--output-dir",
                                            "gs://some-bucket/run"],
         "gs://some-bucket/run/.lock: storage request failed", only_line=True),
    # Nothing to do is an error
    Case("whitespace-only corpus", lambda t, c: _tok(t, str(write(t / "blank.txt", "   \n\t\n  \n\n   \n"))),
         "blank.txt: no text to train the tokenizer on (empty or only whitespace)", only_line=True),
    Case("fewer tokens than one sample", lambda t, c: ["shard", "--corpus", str(write(t / "short.txt", "Hello there.\n")),
                                                       "--output-dir", str(t / "out"), f"tokenizer.path={c['tok']}",
                                                       "shard.seq_len=64"],
         "fewer than one training sample of shard.seq_len-2=62 tokens", fixtures=("ray_local",)),
    # Paths stay inside the directory that holds them
    Case("manifest entry outside the shard dir", lambda t, c: _train(t, c),
         "manifest.json: train.shards[0] path '../../../../etc/hostname' points outside the shard directory",
         ["run/checkpoints", "run/model"], prepared=True, setup=_manifest_entry_outside),
    Case("run name '..'", lambda t, c: ["tokenizer", "--corpus", str(c["corpus"]), "name=.."],
         "name=\"..\": must be a non-empty name without '/', and not '.' or '..'", ["runs"], only_line=True),
]


@pytest.mark.parametrize("case", CLI, ids=[c.name for c in CLI])
def test_cli_refuses_with_exit_2_one_line_and_no_output(case, tmp_path, capsys, small_corpus, tiny_tokenizer_dir,
                                                        request, monkeypatch):
    if "bucket" in case.name:
        request.getfixturevalue("gcs_emulator")
    if case.name == "unreachable store":  # nothing listens on port 1: gcsfs retries and logs tracebacks
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    for name in case.fixtures:
        request.getfixturevalue(name)
    monkeypatch.chdir(tmp_path)  # a default runs/<name> would land here, not in the repository
    ctx: dict = {"corpus": small_corpus, "tok": tiny_tokenizer_dir}
    if case.prepared:
        ctx["cfg"] = prepared_run(tmp_path / "run", small_corpus, tiny_tokenizer_dir)
        ctx["yaml"] = config_file(tmp_path, ctx["cfg"])
    if case.setup:
        case.setup(tmp_path, ctx)
    saved = (tmp_path / "run" / "config.yaml").read_text() if (tmp_path / "run" / "config.yaml").exists() else None
    capsys.readouterr()
    code = main(case.argv(tmp_path, ctx))
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if line.startswith("tpu-ray: error: ")]
    assert len(errors) == 1 and errors[0] == len(lines) - 1, err  # exactly one error line, and it is last
    needle = case.needle(ctx) if callable(case.needle) else case.needle
    assert needle in lines[-1]
    if case.only_line:
        assert len(lines) == 1, err
    for rel in case.absent:
        assert not (tmp_path / rel).exists(), f"{rel} left behind"
    if saved is not None:  # a refused resume must not rewrite the run's saved config
        assert (tmp_path / "run" / "config.yaml").read_text() == saved
    assert not list(tmp_path.rglob(".tmp-*")), "temporary files left behind"


# --------------------------------------------------------------------------------------------
# A full and a read-only filesystem: real tmpfs mounts (root only; skipped elsewhere)
# --------------------------------------------------------------------------------------------
@pytest.fixture()
def tmpfs(tmp_path):
    """mount(size, readonly) -> a fresh tmpfs directory; unmounted at the end."""
    import os
    import subprocess

    mounts: list[Path] = []

    def mount(size: str, readonly: bool = False) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        point = tmp_path / f"mnt{len(mounts)}"
        point.mkdir()
        opts = f"size={size}" + (",ro" if readonly else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(point)], capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounts.append(point)
        return point

    yield mount
    for point in mounts:
        subprocess.run(["umount", "-l", str(point)], check=False)


def _one_error_line(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    errors = [line for line in lines if line.startswith("tpu-ray: error: ")]
    assert len(errors) == 1 and errors[0] == lines[-1], err
    assert "internal error" not in lines[-1]
    return lines[-1]


@pytest.mark.quick
def test_read_only_output_dir_is_one_line(tmpfs, small_corpus, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    ro = tmpfs("64k", readonly=True)
    line = _one_error_line(capsys, ["tokenizer", "--corpus", str(small_corpus), "--output-dir", str(ro / "run"),
                                    "tokenizer.vocab_size=100"])
    assert f"{ro / 'run'}: read-only file system; the filesystem is read-only; choose a writable --output-dir" in line


@pytest.mark.quick
def test_full_disk_is_one_line_naming_the_file(tmpfs, small_corpus, capsys, monkeypatch, tmp_path):
    """Four pages: the run's lock, config.yaml, run_info.json and metrics.jsonl (the stage's start)
    fit, the tokenizer's files do not."""
    monkeypatch.chdir(tmp_path)
    full = tmpfs("16k")
    line = _one_error_line(capsys, ["tokenizer", "--corpus", str(small_corpus), "--output-dir", str(full / "run"),
                                    "tokenizer.vocab_size=100"])
    assert f"{full / 'run' / 'tokenizer'}/" in line and ": no space left on device; free space" in line, line
    assert not list((full / "run").rglob(".tmp-*")), "temporary files left on the full disk"
