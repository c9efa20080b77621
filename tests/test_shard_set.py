"""ShardSet owns the manifest (schema, validation, resume state, verification).

Real shards and manifests, written by the shard stage's own functions in-process (no Ray needed).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.test_doctor import prepared_run
from tpu_ray import storage
from tpu_ray.errors import UserError
from tpu_ray.prepare.shard_set import SPLITS, ShardSet, manifest_path

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def run(tmp_path, small_corpus, tiny_tokenizer_dir):
    return prepared_run(tmp_path / "run", small_corpus, tiny_tokenizer_dir)


def _raw(cfg) -> dict:
    return json.loads(Path(manifest_path(cfg.shards_dir)).read_text())


def _write(cfg, manifest: dict) -> None:
    Path(manifest_path(cfg.shards_dir)).write_text(json.dumps(manifest))


def test_the_manifest_round_trips_and_keeps_its_layout(run):
    """What the shard stage wrote loads into a ShardSet that writes the same JSON back (older
    readers and the reference-format contract see no change); files are in unit order."""
    raw = _raw(run)
    shards = ShardSet.load(run.shards_dir)
    assert shards.to_json() == raw
    assert shards.complete and shards.seq_len == run.shard.seq_len and shards.format == "tpu-ray-shards/2"
    for split in SPLITS:
        files = shards.files(split)
        assert [p for p, _ in files] == [str(Path(run.shards_dir) / e["path"]) for e in raw["splits"][split]["shards"]]
        assert sum(n for _, n in files) == raw["splits"][split]["samples"] == shards.samples(split)
        units = [e.unit for e in shards.split_entries(split)]
        assert units == sorted(units)


@pytest.mark.parametrize("edit, expected", [
    (lambda m: m.update(seq_len="64"), r"manifest.json: seq_len is str '64', not int"),
    (lambda m: m.update(tokenizer_sha256=7), r"manifest.json: tokenizer_sha256 is int '7', not str"),
    (lambda m: m["splits"]["train"]["shards"][0].update(samples=True),
     r"manifest.json: train.shards\[0\] lacks a path or a sample count"),
    (lambda m: m["splits"]["train"]["shards"][1].update(bytes="12"),
     r"manifest.json: train.shards\[1\]: bytes is str '12', not int"),
    (lambda m: m["splits"]["validation"]["shards"][0].update(path="/etc/hostname"),
     r"validation.shards\[0\] path '/etc/hostname' points outside the shard directory"),
    (lambda m: m["splits"].pop("validation"), r"not a tpu-ray shard manifest \(no train/validation splits\)"),
    (lambda m: m["splits"]["train"].update(shards={}), r"train.shards is not a list"),
    (lambda m: m.update(complete="yes"), r"manifest.json: complete is str 'yes', not bool"),
    (lambda m: m.update(units_done=["0"]), r"units_done holds '0', not a unit number"),
    (lambda m: m["unit_stats"][0].pop("dropped"), r"unit_stats\[0\] lacks dropped"),
    (lambda m: m["unit_stats"][1].update(tokens=1.5), r"unit_stats\[1\]: tokens is float '1.5', not int"),
    (lambda m: m["unit_stats"][0].update(skipped="x"), r"unit_stats\[0\]: skipped is str 'x', not int"),
    # what the writer never makes: counts below 1 or beyond int64, a count its name contradicts
    (lambda m: m["splits"]["train"]["shards"][1].update(samples=-5), r"train.shards\[1\]: samples is -5, not a count"),
    (lambda m: m["splits"]["train"]["shards"][1].update(samples=0), r"train.shards\[1\]: samples is 0, not a count"),
    (lambda m: m["splits"]["train"]["shards"][1].update(samples=2**70), r"samples is \d+, not a count of at least 1"),
    (lambda m: m["splits"]["train"]["shards"][0].update(samples=m["splits"]["train"]["shards"][0]["samples"] + 1),
     r"train.shards\[0\]: samples is \d+, its name says \d+"),
    (lambda m: m["splits"]["train"]["shards"][0].update(bytes=-1), r"train.shards\[0\]: bytes is -1, not a file size"),
    (lambda m: m["splits"]["train"]["shards"][0].update(sha256=""), r"sha256 '' is not a sha256"),
    (lambda m: m["splits"]["train"]["shards"][0].update(unit=-1), r"unit -1 is not a unit of the plan"),
    (lambda m: m["splits"]["train"]["shards"][0].update(unit=10**6), r"unit 1000000 is not a unit of the plan"),
    (lambda m: m.update(units_done=m["units_done"] + [99]), r"units_done holds 99, not a unit number below units="),
    (lambda m: m.update(format="garbage"), r"format 'garbage' is not a tpu-ray shard format"),
    # one file counted twice, or a train shard scored as validation
    (lambda m: m["splits"]["train"]["shards"].append(dict(m["splits"]["train"]["shards"][0])), r"is listed twice"),
    (lambda m: m["splits"]["validation"]["shards"].append(dict(m["splits"]["train"]["shards"][0])),
     r"validation.shards\[\d+\] path 'train/[^']+' is not a validation shard"),
    (lambda m: m["splits"]["train"]["shards"][0].update(path="train/a\nb-3.tfrecord"), r"points outside"),
])
def test_a_damaged_manifest_is_one_line_naming_the_field(run, edit, expected):
    manifest = _raw(run)
    edit(manifest)
    _write(run, manifest)
    with pytest.raises(UserError, match=expected) as err:
        ShardSet.load(run.shards_dir)
    assert "\n" not in str(err.value) and "delete it to rebuild the shards" in str(err.value)


@pytest.mark.parametrize("content, expected", [
    (b"{not json", "manifest is not valid JSON"),
    (b'{"splits": ' + b"9" * 5000 + b"}", "manifest is not valid JSON"),  # int() refuses 5,000 digits
    (b"[" * 100_000 + b"]" * 100_000, "manifest is not valid JSON"),  # deeper than the recursion limit
    (b'{"splits": "\xff\xfe"}', "manifest is not valid JSON"),
    (b"[1, 2]", "not a tpu-ray shard manifest"),
])
def test_a_manifest_that_is_not_one_is_named(run, content, expected):
    Path(manifest_path(run.shards_dir)).write_bytes(content)
    with pytest.raises(UserError, match=f"manifest.json: {expected}"):
        ShardSet.open(run.shards_dir)


@pytest.mark.quick
def test_a_directory_in_the_manifests_place_is_named(tmp_path):
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(UserError, match="manifest.json: is a directory, not a manifest"):
        ShardSet.load(str(tmp_path))


@pytest.mark.quick
def test_no_manifest_means_counts_from_names(tmp_path):
    """The reference scripts' layout (no manifest): counts from `-<count>.tfrecord`, and nothing to verify."""
    from tpu_ray.prepare.tfrecord import serialize_examples, write_records

    for split, n in (("train", 3), ("validation", 2)):
        (tmp_path / split).mkdir()
        with open(tmp_path / split / f"{split}-00000-{n}.tfrecord", "wb") as f:
            write_records(f, serialize_examples(np.full((n, 8), 5)))
    assert ShardSet.load(str(tmp_path)) is None
    shards = ShardSet.open(str(tmp_path))
    assert not shards.manifest and shards.files("train") == [(str(tmp_path / "train/train-00000-3.tfrecord"), 3)]
    assert shards.samples("validation") == 2
    shards.verify()  # nothing recorded to check against
    assert ("manifest", "none: counts from the shard names") in shards.describe()


def test_resume_state_comes_from_one_listing_and_drops_a_unit_whose_file_vanished(run):
    """The shard stage's resume: one listing (no `exists` per shard); a unit with a missing shard is redone."""
    shards = ShardSet.load(run.shards_dir)
    victim = shards.split_entries("train")[1]
    Path(run.shards_dir, victim.path).unlink()
    before = dict(storage.REQUESTS)
    done = shards.committed_units(shards.plan_sha256, shards.tokenizer_sha256, shards.seq_len)
    calls = {k: v - before.get(k, 0) for k, v in storage.REQUESTS.items() if v != before.get(k, 0)}
    assert calls == {"find_sizes": 1}
    assert victim.unit not in done and len(done) == len(shards.units_done) - 1
    kept = done[shards.split_entries("train")[0].unit]
    assert kept["tokens"] > 0 and all(s["split"] in SPLITS for s in kept["shards"])


def test_another_plan_discards_an_unfinished_attempt_and_refuses_a_finished_one(run, caplog):
    shards = ShardSet.load(run.shards_dir)
    with pytest.raises(UserError, match="these shards were made from another corpus, tokenizer or seq_len"):
        shards.committed_units("another plan", shards.tokenizer_sha256, shards.seq_len)
    manifest = _raw(run)
    manifest["complete"] = False
    _write(run, manifest)
    unfinished = ShardSet.load(run.shards_dir)
    with caplog.at_level("WARNING", logger="tpu_ray"):
        assert unfinished.committed_units("another plan", shards.tokenizer_sha256, shards.seq_len) == {}
    assert "unfinished attempt over another corpus plan" in caplog.text
    assert not list(Path(run.shards_dir).rglob("*.tfrecord")) and ShardSet.load(run.shards_dir) is None


@pytest.mark.parametrize("damage, expected", [
    (lambda p: p.unlink(), r"listed in manifest.json but missing"),
    (lambda p: p.write_bytes(p.read_bytes()[:-3]), r"\d+ bytes, manifest.json says \d+ \(truncated or rewritten\)"),
    (lambda p: p.write_bytes(bytes([p.read_bytes()[0] ^ 1]) + p.read_bytes()[1:]), r"sha256 \w+ does not match"),
])
def test_verify_names_the_damaged_shard(run, damage, expected):
    shards = ShardSet.load(run.shards_dir)
    entry = shards.split_entries("validation")[0]
    damage(Path(run.shards_dir, entry.path))
    with pytest.raises(UserError, match=re.escape(entry.path) + ": " + expected):
        ShardSet.load(run.shards_dir).verify()


def test_a_record_count_that_disagrees_is_named(run):
    """A shard rewritten with other records whose size and sha256 were recorded anew (its name
    and entry still say the old count): the record count itself is checked."""
    import hashlib

    from tpu_ray.prepare.tfrecord import serialize_examples, write_records

    manifest = _raw(run)
    entry = manifest["splits"]["train"]["shards"][0]
    path = Path(run.shards_dir, entry["path"])
    with open(path, "wb") as f:
        write_records(f, serialize_examples(np.full((entry["samples"] - 1, run.shard.seq_len), 5)))
    data = path.read_bytes()
    entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    _write(run, manifest)
    with pytest.raises(UserError, match=re.escape(entry["path"]) + r": \d+ records, manifest.json says"):
        ShardSet.load(run.shards_dir).verify()


def test_made_with_names_the_tokenizer_and_seq_len(run):
    from tpu_ray.prepare.tokenizer import tokenizer_info

    shards, tok = ShardSet.load(run.shards_dir), tokenizer_info(run.tokenizer_dir)
    shards.require_made_with(tok, run.shard.seq_len, run.tokenizer_dir)
    assert shards.vocab_mismatches(tok) == []
    with pytest.raises(UserError, match=f"shards have seq_len={run.shard.seq_len}, config says shard.seq_len=32"):
        shards.require_made_with(tok, 32, run.tokenizer_dir)
    manifest = _raw(run)
    manifest["vocab_size"] = 7
    _write(run, manifest)
    assert ShardSet.load(run.shards_dir).vocab_mismatches(tok) == [
        f"shards were made with vocab_size 7, tokenizer has {tok.vocab_size}"]


def test_data_loss_in_tf_data_is_named_by_file(run):
    """tf.data's DataLossError names no file; inside naming_corrupt_files it names the shard."""
    import tensorflow as tf

    shards = ShardSet.load(run.shards_dir)
    path = Path(shards.files("train")[-1][0])
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(UserError, match=re.escape(str(path)) + ": truncated or corrupt TFRecord"):
        with shards.naming_corrupt_files():
            for _ in tf.data.TFRecordDataset([p for p, _ in shards.files("train")]):
                pass


def test_the_report_shows_the_shard_set(run):
    from tests.test_report import make_run
    from tpu_ray.report import write_report

    make_run(Path(run.run_dir))
    page = Path(write_report(run.run_dir)["report.html"]).read_text()
    shards = ShardSet.load(run.shards_dir)
    assert "<h2>Shards</h2>" in page and f"{shards.samples('train'):,} train" in page
    assert f"<th>skipped records</th><td>{shards.skipped_records:,}</td>" in page


@pytest.mark.quick
def test_only_the_shard_set_reads_the_manifest_layout():
    """The manifest's JSON layout (its `splits` key) is read and written in prepare/shard_set.py alone;
    every other module goes through ShardSet, the manifest's one owner."""
    readers = [p.relative_to(REPO).as_posix() for p in (REPO / "tpu_ray").rglob("*.py")
               if re.search(r"""["']splits["']""", p.read_text())]
    assert readers == ["tpu_ray/prepare/shard_set.py"]


@pytest.mark.parametrize("link", ["dangling", "loop"])
def test_a_broken_link_in_the_manifests_place_is_named_not_taken_for_no_manifest(run, link):
    """A manifest that is a broken symlink is damage: never 'no manifest' (which trains unchecked,
    by names, or reshards everything); doctor fails it, report still renders."""
    from tests.test_doctor import doctor

    path = Path(manifest_path(run.shards_dir))
    path.unlink()
    path.symlink_to(path.parent / "gone.json" if link == "dangling" else path)
    with pytest.raises(UserError, match="manifest.json: (a symbolic link to a missing file|cannot be read)"):
        ShardSet.open(run.shards_dir)
    code, checks = doctor(run)
    assert code == 1 and checks["manifest"][0] == "FAIL"
    from tpu_ray.report import _shard_rows

    assert _shard_rows(run.run_dir)[0][1].startswith("cannot be read:")


def test_resume_redoes_units_whose_files_or_records_do_not_add_up(run, caplog):
    """The shard stage never rewrites a damaged set as complete: a cut or rewritten shard (size
    from the listing), or a unit whose entries no longer hold its kept tokens, is redone."""
    shards = ShardSet.load(run.shards_dir)
    cut, other = shards.split_entries("train")[0], shards.split_entries("train")[2]
    Path(run.shards_dir, cut.path).write_bytes(Path(run.shards_dir, cut.path).read_bytes()[:100])
    manifest = _raw(run)
    manifest["splits"]["train"]["shards"] = [e for e in manifest["splits"]["train"]["shards"]
                                             if e["path"] != other.path]  # an entry deleted by hand
    manifest["complete"] = False
    _write(run, manifest)
    edited = ShardSet.load(run.shards_dir)
    with caplog.at_level("WARNING", logger="tpu_ray"):
        done = edited.committed_units(edited.plan_sha256, edited.tokenizer_sha256, edited.seq_len)
    assert cut.unit not in done and other.unit not in done
    assert set(done) == set(edited.units_done) - {cut.unit, other.unit}
    assert "2 committed unit(s) do not match their files or records" in caplog.text


def test_eval_checks_the_validation_shards_and_names_a_missing_one(run):
    """Eval reads the validation split: it is checked first (a deleted shard was a NotFoundError, exit 1)."""
    shards = ShardSet.load(run.shards_dir)
    gone = shards.split_entries("validation")[-1]
    Path(run.shards_dir, gone.path).unlink()
    with pytest.raises(UserError, match=re.escape(gone.path) + ": listed in manifest.json but missing"):
        shards.verify(splits=("validation",))
    shards.verify(splits=("train",))  # the train split is whole


@pytest.mark.quick
def test_shards_without_a_manifest_are_counted_against_their_names(tmp_path):
    """No manifest: the names' counts are all there is, so training checks them (a renamed file
    trained and resumed with wrong counts; a count of 0 divided by zero)."""
    from tpu_ray.prepare.tfrecord import serialize_examples, write_records

    (tmp_path / "train").mkdir()
    with open(tmp_path / "train" / "train-00000-3.tfrecord", "wb") as f:
        write_records(f, serialize_examples(np.full((2, 8), 5)))
    with pytest.raises(UserError, match=r"train-00000-3.tfrecord: 2 records, its name says 3"):
        ShardSet.open(str(tmp_path)).verify()
    (tmp_path / "train" / "train-00000-3.tfrecord").rename(tmp_path / "train" / "train-00000-0.tfrecord")
    with pytest.raises(UserError, match=r"train-00000-0.tfrecord: shard name has no sample count of at least 1"):
        ShardSet.open(str(tmp_path))


def test_doctor_and_report_describe_shards_without_a_manifest(run):
    from tests.test_doctor import doctor
    from tests.test_report import make_run
    from tpu_ray.report import write_report

    Path(manifest_path(run.shards_dir)).unlink()
    code, checks = doctor(run)
    assert checks["shards"][0] == "PASS" and "without a manifest: record counts of all match their names" in \
        checks["shards"][1]
    assert checks["manifest/tok"][0] == "WARN" and "tokenizer that made them is not recorded" in checks["manifest/tok"][1]
    make_run(Path(run.run_dir))
    page = Path(write_report(run.run_dir)["report.html"]).read_text()
    assert "none: counts from the shard names" in page
