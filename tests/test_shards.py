"""Sharding on a real local Ray cluster: determinism, resume, exactly-once, formats, bad input."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import manifest_json, shard_files, tiny_config, wikitext_slice
from tpu_ray.prepare import shards as shards_mod
from tpu_ray.errors import UserError
from tpu_ray.prepare.shard_set import ShardSet
from tpu_ray.prepare.shards import chunk_ids, make_shards
from tpu_ray.pipeline import shard_job
from tpu_ray.prepare.tfrecord import read_records


def _digest_dir(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


def _cfg(tmp_path, corpus, tok, name="run", **over):
    return tiny_config(tmp_path / name, corpus, **{"tokenizer.path": tok, **over})


@pytest.fixture(scope="module")
def mid_corpus(tmp_path_factory, wikitext) -> Path:
    """~1 MB of WikiText-2: 16 work units of 64 KiB."""
    return wikitext_slice(tmp_path_factory, 1_000_000, "mid.txt")


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, mid_corpus, tiny_tokenizer_dir, ray_local):
    """One uninterrupted run with 2 actors: the bytes every other run must reproduce."""
    tmp = tmp_path_factory.mktemp("ref")
    cfg = _cfg(tmp, mid_corpus, tiny_tokenizer_dir)
    summary = make_shards(shard_job(cfg), actors=2)
    return cfg, summary, _digest_dir(Path(cfg.shards_dir))


@pytest.mark.quick
def test_chunking_loses_only_the_counted_remainder():
    lists = [[5, 6, 7], [], [8, 9], [10] * 20]
    rows, tokens, dropped = chunk_ids(lists, seq_len=8, cls_id=0, sep_id=2)
    flat = [5, 6, 7, 2, 8, 9, 2] + [10] * 20 + [2]
    assert tokens == len(flat) == 28
    assert rows.shape == (4, 8) and dropped == 28 - 4 * 6
    assert (rows[:, 0] == 0).all() and (rows[:, -1] == 2).all()
    assert rows[:, 1:-1].ravel().tolist() == flat[:24]


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_shards_are_identical_with_one_actor_or_three(tmp_path, reference_run, mid_corpus, tiny_tokenizer_dir):
    cfg_ref, summary, expected = reference_run
    assert summary.units >= 10 and summary.shards >= 10
    for n in (1, 3):
        cfg = _cfg(tmp_path, mid_corpus, tiny_tokenizer_dir, name=f"a{n}")
        make_shards(shard_job(cfg), actors=n)
        assert _digest_dir(Path(cfg.shards_dir)) == expected, f"{n} actors gave other bytes"


def test_manifest_describes_every_shard(reference_run):
    cfg, summary, _ = reference_run
    manifest = manifest_json(cfg.shards_dir)
    assert manifest["complete"] and manifest["seq_len"] == 64
    for split in ("train", "validation"):
        for entry in manifest["splits"][split]["shards"]:
            path = Path(cfg.shards_dir) / entry["path"]
            data = path.read_bytes()
            assert hashlib.sha256(data).hexdigest() == entry["sha256"]
            assert re.fullmatch(rf"{split}/{split}-\d{{5}}-{entry['samples']}\.tfrecord", entry["path"])
            with open(path, "rb") as f:
                assert sum(1 for _ in read_records(f)) == entry["samples"]
    assert summary.samples == sum(manifest["splits"][s]["samples"] for s in ("train", "validation"))
    assert manifest["corpus_tokens"] == summary.tokens and manifest["dropped_tokens"] == summary.dropped_tokens
    assert not list(Path(cfg.shards_dir).rglob(".tmp-*"))


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_resume_after_a_crash_skips_committed_units_and_gives_the_same_bytes(
        tmp_path, monkeypatch, reference_run, mid_corpus, tiny_tokenizer_dir, caplog):
    _, _, expected = reference_run
    cfg = _cfg(tmp_path, mid_corpus, tiny_tokenizer_dir)
    real_write = ShardSet.write
    calls = {"n": 0}

    def crash_after_three(self):
        real_write(self)
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated crash of the driver")

    monkeypatch.setattr(ShardSet, "write", crash_after_three)
    with pytest.raises(KeyboardInterrupt), caplog.at_level("WARNING", logger="tpu_ray"):
        make_shards(shard_job(cfg), actors=2)
    monkeypatch.setattr(ShardSet, "write", real_write)
    partial = manifest_json(cfg.shards_dir)
    assert not partial["complete"] and len(partial["units_done"]) == 3
    # Ctrl-C says what was kept and that the same command continues.
    assert re.search(r"interrupted; 3 of \d+ units are committed and kept in .*; run the same command", caplog.text)
    with pytest.raises(UserError, match="sharding did not finish"):
        shard_files(cfg.shards_dir, "train")  # training refuses a half-made shard set
    summary = make_shards(shard_job(cfg), actors=2)
    assert summary.skipped_units == 3
    assert _digest_dir(Path(cfg.shards_dir)) == expected
    # The rate counts this run's tokens only: the resumed units' tokens are reported apart.
    resumed = sum(u["tokens"] for u in partial["unit_stats"])
    assert summary.resumed_tokens == resumed > 0 and f"resumed_tokens={resumed} " in summary.line()
    assert summary.tokens_per_s * summary.seconds == pytest.approx(summary.tokens - resumed)


def test_manifest_is_rewritten_a_bounded_number_of_times(tmp_path, monkeypatch, small_corpus, tiny_tokenizer_dir,
                                                          ray_local):
    """Rewriting the whole manifest after every unit would cost O(units^2) bytes on a big corpus."""
    cfg = _cfg(tmp_path, small_corpus, tiny_tokenizer_dir)
    real_write = ShardSet.write
    written: list[tuple[int, bool]] = []

    def counting_write(self):
        written.append((len(self.units_done), self.complete))
        real_write(self)

    monkeypatch.setattr(shards_mod, "MANIFEST_WRITES", 2)
    monkeypatch.setattr(ShardSet, "write", counting_write)
    summary = make_shards(shard_job(cfg), actors=2)
    assert summary.units == 5
    assert written == [(2, False), (4, False), (5, True)]


def test_a_killed_actor_loses_no_sample_and_duplicates_none(tmp_path, reference_run, mid_corpus,
                                                            tiny_tokenizer_dir):
    import ray

    _, ref_summary, expected = reference_run
    cfg = _cfg(tmp_path, mid_corpus, tiny_tokenizer_dir)
    killed = []

    def kill_one(done, pool):
        if done == 2 and not killed:
            killed.append(pool[0])
            ray.kill(pool[0], no_restart=True)

    summary = make_shards(shard_job(cfg), actors=2, on_unit_done=kill_one)
    assert killed
    assert _digest_dir(Path(cfg.shards_dir)) == expected
    assert summary.samples == ref_summary.samples
    # Every sample exactly once: the multiset of samples equals the reference run's.
    rows = set()
    total = 0
    for path, _ in shard_files(cfg.shards_dir, "train") + shard_files(cfg.shards_dir, "validation"):
        with open(path, "rb") as f:
            for rec in read_records(f):
                rows.add(hashlib.sha1(rec).digest())
                total += 1
    assert total == summary.samples


def test_tensorflow_reads_our_shards_like_the_reference_trainer(reference_run):
    """The reference run_mlm.py pointed at RUN/shards/train: its glob `<folder>/*.tfrecord` finds the
    train shards and only them, counts from names, parse_single_example with fixed lengths."""
    tf = pytest.importorskip("tensorflow")
    cfg, _, _ = reference_run
    manifest = manifest_json(cfg.shards_dir)
    assert not list(Path(cfg.shards_dir).glob("*.tfrecord"))  # no shard outside its split's folder
    for split in ("train", "validation"):
        found = tf.io.gfile.glob(str(Path(cfg.shards_dir) / split / "*.tfrecord"))
        assert sorted(Path(f).name for f in found) == sorted(
            Path(e["path"]).name for e in manifest["splits"][split]["shards"]) and found
        assert all(Path(f).name.startswith(f"{split}-") for f in found)
    files = tf.io.gfile.glob(str(Path(cfg.shards_dir) / "train" / "*.tfrecord"))
    counts = [int(re.search(r"-\d+-(\d+)\.tfrecord", f).group(1)) for f in files]
    assert sum(counts) == manifest["splits"]["train"]["samples"]
    features = {k: tf.io.FixedLenFeature([64], tf.int64) for k in ("input_ids", "attention_mask")}
    n = 0
    for rec in tf.data.TFRecordDataset(files):
        ex = tf.io.parse_single_example(rec, features)
        assert ex["input_ids"].shape == (64,) and int(ex["input_ids"][0]) == 0
        n += 1
    assert n == sum(counts)


@pytest.mark.quick
def test_reference_format_shards_are_found_without_a_manifest(tmp_path):
    tf = pytest.importorskip("tensorflow")
    for i, count in enumerate((3, 5)):
        with tf.io.TFRecordWriter(str(tmp_path / f"train-{i}-{count}.tfrecord")) as w:
            for _ in range(count):
                feat = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=[0] * 8))
                        for k in ("input_ids", "attention_mask")}
                w.write(tf.train.Example(features=tf.train.Features(feature=feat)).SerializeToString())
    found = shard_files(str(tmp_path), "train")
    assert [n for _, n in found] == [3, 5]
    (tmp_path / "train-oops.tfrecord").write_bytes(b"")
    with pytest.raises(UserError, match="train-oops.tfrecord: shard name has no sample count"):
        shard_files(str(tmp_path), "train")


# ------------------------------------------------------------------------------------------
# Bad input: one line naming the culprit, before any shard is written
# ------------------------------------------------------------------------------------------
def _no_shards(cfg) -> bool:
    d = Path(cfg.shards_dir)
    return not d.exists() or not list(d.rglob("*.tfrecord"))


def test_empty_corpus(tmp_path, tiny_tokenizer_dir, ray_local):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    cfg = _cfg(tmp_path, empty, tiny_tokenizer_dir)
    with pytest.raises(UserError, match="the corpus is empty"):
        make_shards(shard_job(cfg))
    assert _no_shards(cfg)


def test_missing_corpus_file(tmp_path, tiny_tokenizer_dir, ray_local):
    cfg = _cfg(tmp_path, tmp_path / "nope.txt", tiny_tokenizer_dir)
    with pytest.raises(UserError, match=r"nope.txt.*no such file"):
        make_shards(shard_job(cfg))
    assert _no_shards(cfg)


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_non_utf8_fails_with_file_and_offset_or_is_replaced(tmp_path, small_corpus, tiny_tokenizer_dir, ray_local):
    data = small_corpus.read_bytes()
    bad = tmp_path / "latin1.txt"
    offset = 200_000
    bad.write_bytes(data[:offset] + b"caf\xe9\n" + data[offset:])
    cfg = _cfg(tmp_path, bad, tiny_tokenizer_dir, name="fail", **{"corpus.encoding_errors": "fail"})
    with pytest.raises(UserError) as err:
        make_shards(shard_job(cfg))
    assert f"latin1.txt: byte {offset + 3}: not UTF-8" in str(err.value) and "\n" not in str(err.value)
    # Units before the bad one may be committed (the corpus is read once), never a complete set.
    assert manifest_json(cfg.shards_dir) is None or not manifest_json(cfg.shards_dir)["complete"]
    ok = _cfg(tmp_path, bad, tiny_tokenizer_dir, name="replace", **{"corpus.encoding_errors": "replace"})
    assert make_shards(shard_job(ok)).samples > 0


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_bad_bytes_in_a_late_unit_fail_the_one_read_and_the_fixed_rerun_gives_the_clean_bytes(
        tmp_path, reference_run, mid_corpus, tiny_tokenizer_dir, caplog):
    """The corpus is read once (no check pass before sharding). Bad bytes in unit 13 of 16
    fail the shard pass naming the byte; the units committed before it stay in an incomplete
    manifest that training refuses; the fixed file shards to exactly the clean corpus's bytes."""
    _, _, expected = reference_run
    data = mid_corpus.read_bytes()
    offset = data.index(b"\n", 850_000) + 1
    corpus = tmp_path / "mid.txt"
    corpus.write_bytes(data[:offset] + b"caf\xe9\n" + data[offset:])
    cfg = _cfg(tmp_path, corpus, tiny_tokenizer_dir, **{"corpus.encoding_errors": "fail"})
    with pytest.raises(UserError) as err:
        make_shards(shard_job(cfg), actors=1)
    assert f"mid.txt: byte {offset + 3}: not UTF-8" in str(err.value) and "\n" not in str(err.value)
    partial = manifest_json(cfg.shards_dir)
    assert partial is not None and not partial["complete"] and len(partial["units_done"]) >= 1
    with pytest.raises(UserError, match="sharding did not finish"):
        shard_files(cfg.shards_dir, "train")
    corpus.write_bytes(data)  # fixed: another size, so another plan; the unfinished attempt is dropped
    with caplog.at_level("WARNING", logger="tpu_ray"):
        make_shards(shard_job(cfg), actors=2)
    assert "unfinished attempt over another corpus plan" in caplog.text
    got = _digest_dir(Path(cfg.shards_dir))  # the manifest names another corpus path: shards compared
    assert got.pop("manifest.json") and got == {k: v for k, v in expected.items() if k != "manifest.json"}
    assert manifest_json(cfg.shards_dir)["complete"]


def test_binary_file_given_as_text(tmp_path, tiny_tokenizer_dir, ray_local):
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 100)
    cfg = _cfg(tmp_path, binary, tiny_tokenizer_dir)
    with pytest.raises(UserError, match="model.bin: byte 0: NUL byte, this looks like a binary file"):
        make_shards(shard_job(cfg))
    assert _no_shards(cfg)


def test_tokenizer_without_special_tokens(tmp_path, small_corpus, ray_local):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([small_corpus.read_text()[:10000]], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok_dir = tmp_path / "plain"
    tok_dir.mkdir()
    tok.save(str(tok_dir / "tokenizer.json"))
    cfg = _cfg(tmp_path, small_corpus, str(tok_dir))
    # Named against the closest family convention (it has BERT's [UNK]: BERT's others are missing).
    with pytest.raises(UserError, match=r"plain: tokenizer lacks special token\(s\) \[CLS\] \[PAD\] \[SEP\] \[MASK\];"):
        make_shards(shard_job(cfg))
    assert _no_shards(cfg)


@pytest.mark.parametrize("over,needle", [
    ({"shard.seq_len": 4}, "shard.seq_len=4: Input should be greater than or equal to 8"),
    ({"shard.seq_len": 600, "model.max_position_embeddings": 514}, "needs model.max_position_embeddings >= 602"),
])
def test_seq_len_out_of_range(tmp_path, small_corpus, tiny_tokenizer_dir, over, needle):
    with pytest.raises(UserError, match=re.escape(needle)):
        _cfg(tmp_path, small_corpus, tiny_tokenizer_dir, **over)


@pytest.mark.quick
def test_units_do_not_depend_on_actor_count_and_split_lines_cleanly(mid_corpus, tmp_path):
    from tpu_ray.config import CorpusConfig, ShardConfig
    from tpu_ray.prepare.corpus import plan_units, read_unit_text

    units = plan_units(CorpusConfig(source=str(mid_corpus)), ShardConfig(unit_bytes=65536), str(tmp_path))
    data = mid_corpus.read_bytes()
    assert units[0].start == 0 and units[-1].end == len(data)
    for a, b in zip(units, units[1:]):
        assert a.end == b.start and data[a.end - 1:a.end] == b"\n"
    lines = [line for u in units for line in read_unit_text(u, "all")]
    assert lines == [s.strip() for s in data.decode().split("\n") if s.strip()]
    assert json.dumps([u.to_dict() for u in units])  # units travel to actors as plain dicts
    assert np.all([u.start <= u.split_at <= u.end for u in units])


# ------------------------------------------------------------------------------------------
# gs:// end to end, several nodes, the reference format in our trainer, what the user sees
# ------------------------------------------------------------------------------------------
_PATH_DEPENDENT = ("source", "plan_sha256", "owner")  # the manifest records where the corpus was read from


def _shard_digests(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items() if name.endswith(".tfrecord")}


def _manifest_without_paths(text: str | bytes) -> dict:
    return {k: v for k, v in json.loads(text).items() if k not in _PATH_DEPENDENT}


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_gs_corpus_to_gs_shards_gives_the_local_bytes(gcs_emulator, tmp_path, reference_run, mid_corpus,
                                                      tiny_tokenizer_dir):
    from tpu_ray import storage

    cfg_local, local_summary, _ = reference_run
    bucket = gcs_emulator.make_bucket()
    storage.atomic_write_bytes(f"{bucket}/corpus/mid.txt", mid_corpus.read_bytes())
    cfg = _cfg(tmp_path, f"{bucket}/corpus/mid.txt", tiny_tokenizer_dir,
               **{"shard.dir": f"{bucket}/shards"})
    summary = make_shards(shard_job(cfg), actors=2)
    listed = storage.glob(f"{bucket}/shards/*") + storage.glob(f"{bucket}/shards/*/*")
    remote = {p.split("/shards/", 1)[1]: storage.read_bytes(p) for p in listed if not storage.isdir(p)}
    local = {str(p.relative_to(cfg_local.shards_dir)): p.read_bytes()
             for p in Path(cfg_local.shards_dir).rglob("*") if p.is_file()}
    assert _shard_digests(remote) == _shard_digests(local) and len(_shard_digests(local)) >= 10
    assert _manifest_without_paths(remote["manifest.json"]) == _manifest_without_paths(local["manifest.json"])
    assert json.loads(remote["manifest.json"])["source"]["source"] == f"{bucket}/corpus/mid.txt"
    assert not [n for n in remote if n.rsplit("/", 1)[-1].startswith(".tmp-")]
    assert (summary.samples, summary.tokens) == (local_summary.samples, local_summary.tokens)
    found = shard_files(f"{bucket}/shards", "train")
    assert found and all(path.startswith(f"{bucket}/shards/train/train-") for path, _ in found)


@pytest.fixture(scope="class")
def ray_two_nodes():
    """A real 2-node cluster (ray.cluster_utils.Cluster, 1 CPU each) in place of the session's
    single node, built once for the tests of TestOnTwoNodes (which run in a process of their own:
    own_process, so the single node is not put back)."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
@pytest.mark.own_process  # its 2-node cluster in a process of its own (tests/own_process.py)
class TestOnTwoNodes:
    """Sharding on one 2-node cluster, shared by the three tests (a cluster costs seconds to start)."""

    def test_two_nodes_write_the_same_bytes_as_one(self, tmp_path, reference_run, mid_corpus, tiny_tokenizer_dir,
                                                   ray_two_nodes):
        import ray

        _, _, expected = reference_run
        assert len({n["NodeID"] for n in ray.nodes() if n["Alive"]}) == 2
        cfg = _cfg(tmp_path, mid_corpus, tiny_tokenizer_dir, **{"ray.shared_filesystem": True})  # one machine
        make_shards(shard_job(cfg), actors=2)
        assert _digest_dir(Path(cfg.shards_dir)) == expected

    def test_a_local_shard_dir_on_two_nodes_is_refused_before_any_work(self, tmp_path, mid_corpus,
                                                                        tiny_tokenizer_dir, ray_two_nodes):
        """Each node's actors would write to their own disk: refused in one line naming the field."""
        cfg = _cfg(tmp_path, mid_corpus, tiny_tokenizer_dir)
        with pytest.raises(UserError, match=r"^output_dir='.*': sharding on a 2-node Ray cluster needs a directory "
                                            r"every node can read; use gs://.*ray.shared_filesystem=true") as err:
            make_shards(shard_job(cfg), actors=2)
        assert "\n" not in str(err.value)
        assert not Path(cfg.shards_dir).exists()

    def test_a_local_run_dir_for_an_in_memory_corpus_on_two_nodes_is_refused(self, tmp_path, small_corpus,
                                                                            ray_two_nodes):
        """Ray Data writes each block on the node that holds it: a node-local run directory would get
        the corpus scattered over the nodes (prepare/given.py). Refused in one line before anything is
        written. (Here for the 2-node cluster this class starts anyway; it had one of its own.)"""
        import ray

        from tpu_ray.pipeline import given_corpus
        from tpu_ray.prepare.given import write_given

        texts = [s for s in small_corpus.read_text().splitlines() if s.strip()][:10]
        cfg, given = given_corpus(tiny_config(tmp_path / "run", tmp_path / "unused"),
                                  ray.data.from_items([{"text": t} for t in texts]))
        with pytest.raises(UserError, match=r"^output_dir='.*': an in-memory corpus written into the run "
                                            r"directory on a 2-node Ray cluster needs a directory every node"):
            write_given(cfg.corpus, cfg.run_dir, cfg.ray.shared_filesystem, given)
        assert not (tmp_path / "run" / "corpus").exists()


@pytest.mark.quick
def test_reference_format_shards_train_here(tmp_path):
    """Shards as the reference script writes them (TFRecordWriter, <split>/dataset-<i>-<count>, no
    manifest) are found by count and come out of our tf.data pipeline as correct masked batches."""
    tf = pytest.importorskip("tensorflow")
    from tpu_ray.train.inputs import IGNORE, MaskSpec, train_dataset

    seq_len, specials = 16, (0, 1, 2, 3, 4)
    written = {}
    (tmp_path / "train").mkdir()
    for shard, count in enumerate((5, 7)):
        with tf.io.TFRecordWriter(str(tmp_path / "train" / f"dataset-{shard}-{count}.tfrecord")) as w:
            for _ in range(count):
                row = [0] + [5 + len(written) * 20 + j for j in range(seq_len - 2)] + [2]
                written[tuple(row)] = True
                feat = {"input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=row)),
                        "attention_mask": tf.train.Feature(int64_list=tf.train.Int64List(value=[1] * seq_len))}
                w.write(tf.train.Example(features=tf.train.Features(feature=feat)).SerializeToString())
    found = shard_files(str(tmp_path), "train")
    assert [n for _, n in found] == [5, 7]
    spec = MaskSpec(mask_prob=0.15, mask_id=4, vocab_size=1000, special_ids=specials)
    ds = train_dataset([p for p, _ in found], seq_len, batch_size=4, spec=spec, seed=1, shuffle_buffer=16)
    seen = set()
    for batch in ds.take(6):
        ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
        assert ids.shape == labels.shape == (4, seq_len) and (batch["attention_mask"].numpy() == 1).all()
        original = np.where(labels != IGNORE, labels, ids)
        seen.update(tuple(r) for r in original.tolist())
        assert (labels[:, [0, -1]] == IGNORE).all()  # [CLS] and [SEP] are never masked
    assert seen <= set(written) and len(seen) >= 10


def test_progress_and_summary_tell_units_samples_tokens_and_rate(tmp_path, small_corpus, tiny_tokenizer_dir,
                                                                 ray_local, caplog):
    from tpu_ray.prepare.progress import Progress

    cfg = _cfg(tmp_path, small_corpus, tiny_tokenizer_dir)
    with caplog.at_level("INFO", logger="tpu_ray"):
        summary = make_shards(shard_job(cfg), actors=2)
    progress = [r.getMessage() for r in caplog.records if r.name == "tpu_ray.prepare.progress"]
    # The last progress line is forced when every unit is done: units, samples and the rate.
    assert re.fullmatch(rf"\[shard\] {summary.units}/{summary.units} units, {summary.samples:,} samples, "
                        rf"[\d,]+ tokens/s", progress[-1]), progress
    line = summary.line()
    manifest = manifest_json(cfg.shards_dir)
    for field, value in (("shards", summary.shards), ("samples", summary.samples),
                         ("tokens", manifest["corpus_tokens"]), ("dropped_remainder_tokens", manifest["dropped_tokens"])):
        assert f"{field}={value} " in line
    assert re.search(r"seconds=\d+\.\d tokens/s=[\d,]+ ", line)
    assert summary.shards == len(list(Path(cfg.shards_dir).rglob("*.tfrecord")))
    assert summary.peak_actor_rss_bytes > 0
    assert any(line in r.getMessage() for r in caplog.records if r.name == "tpu_ray.prepare.shards")
    # Storage requests counted: per unit one open and its two shard writes, plus the
    # driver's listing, plan and manifest calls: O(units), nothing per shard on top.
    assert f"storage_requests={summary.requests}" in line
    assert summary.units * 3 <= summary.requests <= summary.units * 3 + 30, (summary.requests, summary.units)
    # The bar's text: units done, samples so far, and this run's tokens/s.
    bar = Progress("shard", total=8, done=2, samples=100, tokens=1000)
    bar.advance(1, samples=150, tokens=5000)
    # Resumed units apart, this run's rate, and an ETA from this run's pace.
    assert re.fullmatch(r"3/8 units \(2 resumed\), 150 samples, [\d,]+ tokens/s, ETA \d+:\d\d", bar.text())
    bar.close()


def test_encoding_a_unit_in_batches_gives_the_same_ids(monkeypatch, small_corpus, tiny_tokenizer_dir):
    """Actors encode a unit a batch of lines at a time (bounded memory); the ids must not change."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tiny_tokenizer_dir) / "tokenizer.json"))
    lines = small_corpus.read_text().splitlines()[:300]
    whole = shards_mod.join_ids(shards_mod.encode_lines(tok, lines), sep_id=2)
    monkeypatch.setattr(shards_mod, "ENCODE_BATCH_LINES", 7)
    np.testing.assert_array_equal(shards_mod.encode_joined(tok, lines, sep_id=2), whole)
    assert len(whole) > 1000 and shards_mod.encode_joined(tok, [], sep_id=2).size == 0


class PoisonWorker(shards_mod.ShardWorker):
    """A real sharding actor whose process exits on unit 1: always if `<run>/poison-always` exists,
    once if `<run>/poison-once` exists (the first actor to remove it dies)."""

    def process(self, unit: dict) -> dict:
        import os

        run = Path(self.out_dir).parent
        if unit["index"] == 1:
            if (run / "poison-always").exists():
                os._exit(1)
            try:
                (run / "poison-once").unlink()
                os._exit(1)
            except FileNotFoundError:
                pass
        return super().process(unit)


@pytest.mark.slow  # Ray starts a killed actor's process again: ~40 s on 2 cores (CI, 2026-11-27)
def test_a_unit_that_always_kills_its_actor_fails_after_the_retries_naming_it(
        tmp_path, monkeypatch, small_corpus, tiny_tokenizer_dir, ray_local):
    cfg = _cfg(tmp_path, small_corpus, tiny_tokenizer_dir, **{"shard.max_unit_retries": 2})
    Path(cfg.run_dir).mkdir(parents=True)
    (Path(cfg.run_dir) / "poison-always").touch()
    monkeypatch.setattr(shards_mod, "ShardWorker", PoisonWorker)
    with pytest.raises(UserError) as err:
        make_shards(shard_job(cfg), actors=2)
    msg = str(err.value)
    assert "\n" not in msg
    assert re.search(rf"shard unit 1 \({re.escape(str(small_corpus))} bytes \d+-\d+\) killed its actor 3 times",
                     msg), msg
    assert "likely cause" in msg and "shard.max_unit_retries=2" in msg
    assert not manifest_json(cfg.shards_dir) or not manifest_json(cfg.shards_dir)["complete"]


@pytest.mark.slow  # Ray starts a killed actor's process again: ~40 s on 2 cores (CI, 2026-11-27)
def test_a_unit_that_kills_its_actor_once_is_retried_and_gives_the_same_bytes(
        tmp_path, monkeypatch, small_corpus, tiny_tokenizer_dir, ray_local):
    ref = _cfg(tmp_path, small_corpus, tiny_tokenizer_dir, name="ref")
    make_shards(shard_job(ref), actors=2)
    cfg = _cfg(tmp_path, small_corpus, tiny_tokenizer_dir)
    Path(cfg.run_dir).mkdir(parents=True)
    (Path(cfg.run_dir) / "poison-once").touch()
    monkeypatch.setattr(shards_mod, "ShardWorker", PoisonWorker)
    make_shards(shard_job(cfg), actors=2)
    assert not (Path(cfg.run_dir) / "poison-once").exists()  # the unit did kill an actor
    assert _digest_dir(Path(cfg.shards_dir)) == _digest_dir(Path(ref.shards_dir))


def test_an_actor_that_answers_nothing_is_replaced_and_its_unit_done_by_another(ray_local, tmp_path, caplog):
    """An actor Ray has alive that answers no call (here wedged in its one thread; in a run seen
    here, one whose ALIVE notification the driver never got) is replaced once the pool goes
    `stall_s` without a finished unit, and its unit is done by the new actor. An actor still
    waiting for its CPUs is not taken for one."""
    import time

    from tpu_ray.prepare.actor_pool import run_on_pool, unanswering_actors
    from tpu_ray.prepare.readers.base import WorkUnit

    wedge = tmp_path / "wedge-once"
    wedge.touch()

    @ray_local.remote(num_cpus=0, max_concurrency=1)
    class Worker:
        def process(self, unit: dict) -> dict:
            if wedge.exists():  # the first unit to come wedges its actor for good
                wedge.unlink()
                time.sleep(3600)
            return {"unit": unit["index"]}

    never = Worker.options(num_cpus=64).remote()  # more CPUs than the suite's cluster has: pending
    units = [WorkUnit(index=i, source=f"part-{i}", fmt="text", start=0, split_at=0, end=0) for i in range(3)]
    pool, done = [Worker.remote(), Worker.remote()], {}
    first = list(pool)
    with caplog.at_level("WARNING", logger="tpu_ray.prepare.shards"):
        run_on_pool(pool, units, "process", Worker.remote, lambda u, r: done.setdefault(u.index, r), None,
                    max_retries=1, stall_s=3)
    assert done == {i: {"unit": i} for i in range(3)}
    assert len(pool) == 2 and len(set(pool) - set(first)) == 1  # one actor replaced
    (line,) = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"actor on unit \d answered nothing for 3 s though Ray has it alive; replaced, "
                        r"retry 1 of 1", line), line
    assert unanswering_actors([never, *pool], wait_s=1) == []  # pending and healthy: neither is lost
    ray_local.kill(never)


def test_a_pool_whose_actors_cannot_start_says_so_with_the_free_cpus(ray_local, caplog):
    """A shard pool that makes no progress because an actor never got its CPUs names that, with the
    cluster's free CPUs, instead of a progress bar that never moves."""
    from tpu_ray.prepare.actor_pool import _warn_if_unstarted, unstarted_actors

    @ray_local.remote(num_cpus=0)
    class Starts:
        pass

    starts = Starts.remote()
    never = Starts.options(num_cpus=64).remote()  # more CPUs than the suite's 2-CPU cluster has
    try:
        ray_local.get(starts.__ray_ready__.remote(), timeout=120)
        assert unstarted_actors([starts, never], wait_s=1) == [never]
        with caplog.at_level("WARNING", logger="tpu_ray.prepare.shards"):
            assert _warn_if_unstarted([starts, never], 120)
        (line,) = [r.getMessage() for r in caplog.records]
        assert re.fullmatch(r"1 of 2 actors have not started after 120 s without a finished unit: the cluster "
                            r"has [\d.]+ of 2 CPUs free; .*", line), line
        assert not _warn_if_unstarted([starts], 120)
    finally:
        ray_local.kill(starts)
        ray_local.kill(never)


def test_old_one_folder_run_dirs_still_train_and_are_not_resharded_in_place(tmp_path, reference_run, mid_corpus,
                                                                             tiny_tokenizer_dir):
    """A run dir from before format /2 (train-* and validation-* side by side) still reads; sharding
    into it again stops with one line instead of mixing the two layouts."""
    import shutil

    cfg_ref, _, _ = reference_run
    cfg = _cfg(tmp_path, mid_corpus, tiny_tokenizer_dir)
    old = Path(cfg.shards_dir)
    old.mkdir(parents=True)
    manifest = manifest_json(cfg_ref.shards_dir)
    manifest["format"] = "tpu-ray-shards/1"
    for split in ("train", "validation"):
        for entry in manifest["splits"][split]["shards"]:
            shutil.copy(Path(cfg_ref.shards_dir) / entry["path"], old / Path(entry["path"]).name)
            entry["path"] = Path(entry["path"]).name
    (old / "manifest.json").write_text(json.dumps(manifest))
    found = shard_files(str(old), "train")
    assert found and all(Path(p).parent == old and Path(p).exists() for p, _ in found)
    with pytest.raises(UserError, match=r"manifest.json: shards in the old one-folder layout \(tpu-ray-shards/1\)"):
        make_shards(shard_job(cfg))


@pytest.mark.parametrize("kind", ["bpe", "unigram", "wordpiece"])
@pytest.mark.quick
def test_no_corpus_text_becomes_a_special_id(kind, small_corpus):
    """Special-token strings written in the corpus ("a <pad> b [SEP]") are text. With
    the old encoding they became ids 1 and 2 (padding to RoBERTa's position ids, never masked);
    now no text, these strings included, glued to words or alone, encodes to [CLS] <pad> [SEP]
    [MASK], and the characters are kept. `<unk>` stays the unknown token (a masking target)."""
    from tpu_ray.config import CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK, TokenizerConfig
    from tpu_ray.prepare.tokenizer import describe, train_tokenizer

    hostile = [f"x{t}y {t} a{t} {t}b {''.join(SPECIAL_TOKENS)}" for t in SPECIAL_TOKENS]
    lines = [s for s in small_corpus.read_text().splitlines()[:400] if s.strip()] + hostile * 50
    trained = train_tokenizer([lines], TokenizerConfig(kind=kind, vocab_size=600))
    tok = shards_mod.text_tokenizer(trained.to_str())
    never = shards_mod.never_text_ids(describe(trained.to_str(), "tok"))
    assert never == {trained.token_to_id(t) for t in (CLS, SEP, PAD, MASK)}
    ids = shards_mod.encode_joined(tok, lines[-60:] + ["a <pad> b [SEP]"], sep_id=-1, special_ids=never)
    assert len(ids) > 100 and not set(ids.tolist()) & never, sorted(set(ids.tolist()) & never)
    text = tok.decode(shards_mod.encode_lines(tok, ["a <pad> b [SEP] [CLS]x[MASK]"], never)[0],
                      skip_special_tokens=False).replace(" ", "").replace("##", "")
    assert "<pad>" in text and "[SEP]" in text and "[CLS]x[MASK]" in text, text
    assert shards_mod.encode_lines(tok, ["<unk>"], never)[0] == [trained.token_to_id(UNK)]


def test_progress_shows_units_in_progress_per_actor_and_counts_their_tokens(small_corpus, tiny_tokenizer_dir,
                                                                            tmp_path):
    """Actors report lines, text and tokens of the unit they are on as it happens
    (process_unit fills `live`; ShardWorker.live_progress returns it to the driver), and the
    progress line shows them per actor, their tokens counted in this run's rate."""
    from tokenizers import Tokenizer

    from tpu_ray.config import CorpusConfig, ShardConfig
    from tpu_ray.prepare.corpus import plan_units
    from tpu_ray.prepare.progress import Progress
    from tpu_ray.prepare.shards import process_unit
    from tpu_ray.prepare.tokenizer import describe, load_tokenizer_json

    text = load_tokenizer_json(tiny_tokenizer_dir)
    unit = plan_units(CorpusConfig(source=str(small_corpus)), ShardConfig(unit_bytes=1 << 20), str(tmp_path))[0]
    live = {"unit": unit.index, "lines": 0, "chars": 0, "tokens": 0}
    result = process_unit(unit, Tokenizer.from_str(text), describe(text, tiny_tokenizer_dir), 64,
                          str(tmp_path / "out"), None, live)
    assert live["tokens"] == result["tokens"] > 0 and live["lines"] > 100 and live["chars"] > 100_000

    bar = Progress("shard", total=4, live=lambda: [live])
    bar.tick(force=True)
    assert re.search(rf"0/4 units, 0 samples, [\d,]+ tokens/s; in progress: unit 0: {live['lines']:,} lines "
                     rf"0\.\d MB {live['tokens']:,} tokens$", bar.text()), bar.text()
    assert bar._rate() > 0  # in-flight tokens count in the rate
    bar.close()
@pytest.mark.parametrize("model_type", ["roberta", "bert"])
@pytest.mark.quick
def test_no_corpus_text_becomes_a_family_special_id(model_type, small_corpus):
    """The same rule with a family's own tokens: a RoBERTa tokenizer's `<s>` and
    `</s>` or a BERT one's `[CLS]` written in the corpus stay text; the family's unknown token stays
    the unknown id."""
    from tpu_ray.config import TokenizerConfig
    from tpu_ray.families import family, training_order
    from tpu_ray.prepare.tokenizer import describe, train_tokenizer

    fam = family(model_type)
    specials = fam.tokens.as_tuple()
    hostile = [f"x{t}y {t} a{t} {t}b {''.join(specials)}" for t in specials]
    lines = [s for s in small_corpus.read_text().splitlines()[:400] if s.strip()] + hostile * 50
    trained = train_tokenizer([lines], TokenizerConfig(kind="unigram", vocab_size=600), fam.tokens,
                              training_order(fam))
    info = describe(trained.to_str(), "tok")
    assert info.tokens == fam.tokens
    never = shards_mod.never_text_ids(info)
    tok = shards_mod.text_tokenizer(trained.to_str())
    ids = shards_mod.encode_joined(tok, lines[-60:], sep_id=-1, special_ids=never)
    assert len(ids) > 100 and not set(ids.tolist()) & never, sorted(set(ids.tolist()) & never)
    assert shards_mod.encode_lines(tok, [fam.tokens.unk], never)[0] == [info.unk_id]
