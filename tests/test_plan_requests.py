"""Planning costs O(files) requests and reads a small fraction of the corpus.

A counting fsspec filesystem (the local one, every listing, open, info and byte read counted)
serves the corpus under `counting://`, through the same `storage` calls as gs:// would.
"""

from __future__ import annotations

from collections import Counter

import gzip
import json
import re
from pathlib import Path

import fsspec
import pytest
import zstandard
from fsspec.implementations.local import LocalFileSystem

from tpu_ray.config import CorpusConfig, ShardConfig
from tpu_ray.errors import UserError
from tpu_ray.prepare.corpus import iter_chunks, iter_train_text, plan_units
from tpu_ray.prepare.streams import Counts


class CountingFileSystem(LocalFileSystem):
    """The local filesystem with every request counted (class-level: fsspec caches instances)."""

    protocol = "counting"
    calls: Counter = Counter()
    root_marker = "/"

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        if path.startswith("counting://"):
            path = path[len("counting://"):]
        return LocalFileSystem._strip_protocol(path)

    _listing = False

    def ls(self, path, detail=False, **kwargs):
        self.calls["list"] += 1
        self._listing = True  # the local ls stats each entry: part of the listing, as on a store
        try:
            return super().ls(path, detail=detail, **kwargs)
        finally:
            self._listing = False

    def info(self, path, **kwargs):
        if not self._listing:
            self.calls["info"] += 1
        return super().info(path, **kwargs)

    def _open(self, path, mode="rb", **kwargs):
        self.calls["open"] += 1
        f = super()._open(path, mode, **kwargs)
        read = f.read
        calls = self.calls

        def counted(n=-1):
            data = read(n)
            calls["bytes"] += len(data)
            return data

        f.read = counted
        return f


@pytest.fixture
def counting():
    fsspec.register_implementation("counting", CountingFileSystem, clobber=True)
    CountingFileSystem.calls.clear()
    yield CountingFileSystem.calls
    CountingFileSystem.calls.clear()


@pytest.mark.quick
def test_planning_costs_o_files_requests_and_is_done_once(counting, tmp_path, small_corpus):
    text = small_corpus.read_bytes()[:300_000]
    text = text[: text.rfind(b"\n") + 1]
    corpus_dir = tmp_path / "corpus"
    corpus_dir.mkdir()
    n_files = 4
    for i in range(n_files):
        (corpus_dir / f"part-{i}.txt").write_bytes(text)
    total = n_files * len(text)
    corpus = CorpusConfig(source=f"counting://{corpus_dir}/*.txt", validation_fraction=0.1)
    shard = ShardConfig(unit_bytes=64 * 1024)
    run_dir = str(tmp_path / "run")

    units = plan_units(corpus, shard, run_dir)
    assert len(units) >= 4 * n_files
    planned = dict(counting)
    # One listing for the glob; per file at most two opens (boundaries, then split points), no
    # info or size request per file (sizes come from the listing), and ~2 windows of 4 KiB per unit.
    assert planned.get("list", 0) <= 2, planned
    assert planned.get("open", 0) <= 2 * n_files, planned
    assert planned.get("info", 0) <= n_files, planned
    assert planned["bytes"] <= 0.15 * total, planned

    # The shard stage (and a resume) reuses the stored plan: one listing, nothing opened or read.
    counting.clear()
    assert plan_units(corpus, shard, run_dir) == units
    assert counting.get("open", 0) == 0 and counting.get("bytes", 0) == 0 and counting.get("list", 0) <= 2, counting

    # What the actors read: each unit once, in one open; nothing else (no check pass, no second
    # read for the validation part): at most 1.1x the corpus.
    counting.clear()
    for unit in units:
        for _ in iter_chunks(unit):
            pass
    assert counting["open"] == len(units), counting
    assert counting["bytes"] <= 1.1 * total, counting


@pytest.mark.quick
def test_small_files_are_packed_into_units_planned_from_the_listing_alone(counting, tmp_path, small_corpus):
    """300 files of ~3 KB become units of about shard.unit_bytes (not 300 units,
    shards and manifest entries); planning reads nothing but the listing; sharding opens each file
    once and reads the corpus once; every line is kept, in order."""
    lines = [s for s in small_corpus.read_text().splitlines() if s.strip()][:3000]
    corpus_dir = tmp_path / "many"
    corpus_dir.mkdir()
    for i in range(300):
        (corpus_dir / f"doc-{i:04d}.txt").write_text("\n".join(lines[i * 10:(i + 1) * 10]) + "\n")
    total = sum(p.stat().st_size for p in corpus_dir.iterdir())
    corpus = CorpusConfig(source=f"counting://{corpus_dir}", validation_fraction=0.1)
    units = plan_units(corpus, ShardConfig(unit_bytes=64 * 1024), str(tmp_path / "run"))
    assert len(units) <= total // (32 * 1024) + 1 and all(u.members for u in units), len(units)
    assert counting.get("open", 0) == 0 and counting.get("bytes", 0) == 0 and counting.get("list", 0) <= 2, counting
    counting.clear()
    chunks = [c for u in units for c in iter_chunks(u)]
    assert counting["open"] == 300 and counting["bytes"] == total, counting
    assert [x for c in chunks for x in c.train + c.validation] == [s.strip() for s in lines]
    assert all(c.validation for c in chunks)  # each packed unit keeps its validation tail


@pytest.mark.quick
def test_a_bad_record_in_a_packed_file_is_named_by_its_own_file(tmp_path):
    corpus_dir = tmp_path / "docs"
    corpus_dir.mkdir()
    for i in range(20):
        body = "".join(json.dumps({"text": f"document {i} line {k}"}) + "\n" for k in range(5))
        if i == 7:
            body += '{"text": 12}\n'
        (corpus_dir / f"doc-{i:02d}.jsonl").write_text(body)
    units = plan_units(CorpusConfig(source=str(corpus_dir)), ShardConfig(unit_bytes=64 * 1024), str(tmp_path / "r"))
    assert len(units) == 1 and len(units[0].members) == 20
    with pytest.raises(UserError, match=r"doc-07\.jsonl: byte 150: field .text. is a number, not text"):
        list(iter_chunks(units[0]))


@pytest.mark.quick
def test_a_pack_holds_one_format_and_compression(tmp_path):
    """Each file is read by its own format: a .txt beside a .jsonl is not parsed as JSON (nor the
    .jsonl trained as JSON text), a .gz beside a plain file is not read as plain."""
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "a.jsonl").write_text(json.dumps({"text": "from json"}) + "\n")
    (d / "b.txt").write_text('{"text": "plain text that looks like JSON"}\n')
    (d / "c.txt.gz").write_bytes(gzip.compress(b"compressed\n"))
    (d / "d.txt.gz").write_bytes(gzip.compress(b"more compressed\n"))
    units = plan_units(CorpusConfig(source=str(d), validation_fraction=0), ShardConfig(), str(tmp_path / "r"))
    assert [len(u.members) for u in units] == [0, 0, 2]
    assert [line for u in units for c in iter_chunks(u) for line in c.train] == [
        "from json", '{"text": "plain text that looks like JSON"}', "compressed", "more compressed"]


def _jsonl_files(d: Path, lines: list[str], n: int, suffix: str = ".jsonl.gz") -> None:
    """`lines` as `n` small JSON-lines files, gzip or zstd by `suffix` (C4's shape)."""

    d.mkdir()
    for i in range(n):
        body = "".join(json.dumps({"text": t, "url": f"https://x/{i}"}) + "\n"
                       for t in lines[len(lines) * i // n: len(lines) * (i + 1) // n]).encode()
        (d / f"doc-{i:03d}{suffix}").write_bytes(gzip.compress(body) if suffix.endswith(".gz")
                                                  else zstandard.ZstdCompressor().compress(body))


@pytest.mark.quick
def test_small_compressed_files_are_packed_from_the_listing_and_read_once(counting, tmp_path, small_corpus):
    """C4's shape: 200 small .jsonl.gz files become a few streamed units of about unit_bytes of
    text, planned from the listing and each file's 4-byte gzip size trailer (one batch of tiny
    reads, nothing else per file); sharding opens each file once and reads the stored bytes once;
    every line is kept, in order."""
    from tpu_ray import storage

    lines = [s.strip() for s in small_corpus.read_text().splitlines() if s.strip()]
    _jsonl_files(tmp_path / "c4", lines, 200)
    stored = sum(p.stat().st_size for p in (tmp_path / "c4").iterdir())
    text = sum(len(gzip.decompress(p.read_bytes())) for p in (tmp_path / "c4").iterdir())
    before = storage.requests_made()
    units = plan_units(CorpusConfig(source=f"counting://{tmp_path}/c4", validation_fraction=0.1),
                       ShardConfig(unit_bytes=64 * 1024), str(tmp_path / "run"))
    assert len(units) <= text // (32 * 1024) + 1 and all(u.members and u.streamed for u in units), len(units)
    assert sum(len(u.members) for u in units) == 200
    # One listing, a few calls on the source itself (exists, isdir), and 4 bytes read per file.
    assert counting["open"] == 200 and counting["bytes"] == 4 * 200 and counting.get("list", 0) <= 2, counting
    assert counting.get("info", 0) <= 5 and storage.requests_made() - before <= 10 + 200, (counting, storage.REQUESTS)
    counting.clear()
    chunks = [c for u in units for c in iter_chunks(u)]
    assert counting["open"] == 200 and counting["bytes"] <= 1.1 * stored, (counting, stored)
    assert len(chunks) >= len(units) and [x for c in chunks for x in c.train + c.validation] == lines
    assert all(c.validation for c in chunks)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
@pytest.mark.quick
def test_errors_in_a_packed_compressed_file_name_that_file_and_its_record(suffix, tmp_path, small_corpus):
    """A cut stream, a bad JSON line, a field that is not text, a typo'd text field: each one line
    naming the member file (not the first of the pack) and its own line number."""
    lines = [s.strip() for s in small_corpus.read_text().splitlines() if s.strip()][:400]
    d = tmp_path / "c4"
    _jsonl_files(d, lines, 20, suffix)
    shard = ShardConfig(unit_bytes=4 << 20)

    def error(**corpus) -> str:
        units = plan_units(CorpusConfig(source=str(d), **corpus), shard, str(tmp_path / "run"))
        # One pack of all 20, except that a cut gzip file's size trailer is garbage: it stands alone.
        assert sum(len(u.members) or 1 for u in units) == 20 and len(units[0].members) >= 7
        with pytest.raises(UserError) as info:
            if "text_field" in corpus:  # a typo'd field: the corpus is refused, not a unit
                iter_train_text(units, 1 << 30)
            for unit in units:
                list(iter_chunks(unit))
        assert "\n" not in str(info.value)
        return str(info.value)

    kind = "gzip" if suffix.endswith(".gz") else "zstd"
    assert re.search(rf"doc-0\d\d{suffix}: line 1: record has no field 'body' \(fields: text, url\); set corpus",
                     error(text_field="body"))
    bad = d / f"doc-007{suffix}"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    assert re.search(rf"doc-007{suffix}: after line \d+: {kind} stream is damaged or cut short", error())
    for record, needle in (('{"text": 12}', "field 'text' is a number, not text"),
                           ('{"text": "cut', "not a JSON line"), ('{"url": "no text"}', None)):
        body = "".join(json.dumps({"text": t}) + "\n" for t in lines[:5]) + record + "\n"
        bad.write_bytes(gzip.compress(body.encode()) if kind == "gzip"
                        else zstandard.ZstdCompressor().compress(body.encode()))
        if needle:
            assert re.search(rf"doc-007{suffix}: line 6: {needle}", error()), needle
        else:  # a record without the field among records with it: skipped and counted, not an error
            counts = Counts()
            units = plan_units(CorpusConfig(source=str(d)), shard, str(tmp_path / "run"))
            assert sum(len(c.train) for c in iter_chunks(units[0], counts)) > 0 and counts.skipped == 1


def _parquet_with_html(corpus: Path, path: Path) -> tuple[list[str], int]:
    """A FineWeb-shaped parquet of the corpus's lines in row groups of 100, with an extra column as
    large as the text (the page's HTML) that no unit may read; returns the lines and the text
    column's bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = [s for s in corpus.read_text().splitlines() if s.strip()]
    pq.write_table(pa.table({"text": lines, "html": [f"<p>{s[::-1] * 4}</p>" for s in lines]}), path,
                   row_group_size=100, compression="none")
    md = pq.ParquetFile(path).metadata
    return lines, sum(md.row_group(i).column(0).total_compressed_size for i in range(md.num_row_groups))


@pytest.mark.quick
def test_a_parquet_unit_reads_only_its_row_groups_text_column_once(counting, tmp_path, small_corpus):
    """Planning reads footers only; the units together read the text column once
    (not the other columns, not the whole file per unit); the compressed text column is counted."""
    path = tmp_path / "fw.parquet"
    lines, text_bytes = _parquet_with_html(small_corpus, path)
    size = path.stat().st_size
    units = plan_units(CorpusConfig(source=f"counting://{path}", validation_fraction=0.1),
                       ShardConfig(unit_bytes=16 * 1024), str(tmp_path / "run"))
    # Planning: one open, pyarrow's one footer read (64 KiB from the end), nothing else.
    assert len(units) >= 5 and counting["open"] == 1 and counting["bytes"] <= 64 * 1024, counting
    counting.clear()
    from tpu_ray.prepare import tabular

    tabular._FOOTERS.clear()  # as in a fresh actor: the footer is read once, then remembered
    got = [line for u in units for c in iter_chunks(u) for line in c.train + c.validation]
    assert got == [s.strip() for s in lines]
    # Each unit opens the file once and reads its row groups' text column chunks; the footer once:
    # the text column once in all, the html column never.
    assert counting["open"] == len(units), counting
    assert text_bytes <= counting["bytes"] <= text_bytes + 64 * 1024, (counting, text_bytes, size)


@pytest.mark.parametrize("n_shards", [40, 400])
@pytest.mark.quick
def test_training_start_verifies_shards_from_one_listing(counting, tmp_path, monkeypatch, n_shards):
    """Training start (and every recovery attempt) loads the ShardSet and
    verifies it with one manifest read and one listing of the shard directory, whatever the number
    of shards (no `exists` or `size` request per shard); a shard of the wrong size is still named."""
    import hashlib
    import json

    import numpy as np

    from tpu_ray.errors import UserError
    from tpu_ray.prepare import shard_set
    from tpu_ray.prepare.shard_set import ShardSet
    from tpu_ray.prepare.tfrecord import serialize_examples, write_records

    entries = []
    for i in range(n_shards):
        path = tmp_path / "shards" / "train" / f"train-{i:05d}-4.tfrecord"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            write_records(f, serialize_examples(np.full((4, 16), i)))
        data = path.read_bytes()
        entries.append({"path": f"train/{path.name}", "samples": 4, "bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"complete": True, "splits": {"train": {"shards": entries}, "validation": {"shards": []}}}
    (tmp_path / "shards" / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(shard_set, "CHEAP_HASH_BYTES", 0)  # a large shard set: sizes all, hashes a sample
    counting.clear()
    shards = ShardSet.open(f"counting://{tmp_path}/shards")
    shards.require_complete()
    shards.verify()
    assert len(shards.files("train")) == n_shards
    # ls of the shard dir and of train/ (the local find walks folders; a store lists once).
    assert counting.get("info", 0) == 0 and counting["list"] <= 3, counting
    assert counting["open"] == 1 + shard_set.SAMPLE  # the manifest, then the sampled deep checks; nothing else
    (tmp_path / "shards" / "train" / "train-00007-4.tfrecord").write_bytes(b"short")
    with pytest.raises(UserError, match=r"train-00007-4.tfrecord: 5 bytes, manifest.json says \d+"):
        ShardSet.open(f"counting://{tmp_path}/shards").verify()


@pytest.fixture
def http_calls(gcs_emulator, monkeypatch):
    """Every HTTP request gcsfs makes to the storage emulator, by method, and the body bytes it
    received: the real requests (a counting wrapper around gcsfs's one request method)."""
    from tpu_ray import storage

    cls = storage._emulator_fs_class()
    calls: Counter = Counter()
    inner = cls._call

    async def counted(self, method, path, *args, **kwargs):
        out = await inner(self, method, path, *args, **kwargs)
        calls[method.upper()] += 1
        if method.upper() == "GET" and not kwargs.get("json_out") and not kwargs.get("info_out"):
            calls["bytes"] += len(out[1])
        return out

    monkeypatch.setattr(cls, "_call", counted)
    return calls


@pytest.mark.quick
def test_a_gs_corpus_costs_o_files_requests_and_is_read_once(gcs_emulator, http_calls, tmp_path, small_corpus):
    """The same on a real object store (the emulator, HTTP requests counted): planning is one
    listing and a batch of small ranged reads per file; each unit is one GET of exactly its bytes
    (no info request, no readahead past its end): the corpus once, 1.0x."""
    from tpu_ray import storage

    text = small_corpus.read_bytes()[:300_000]
    text = text[: text.rfind(b"\n") + 1]
    root = gcs_emulator.make_bucket()
    n_files = 3
    for i in range(n_files):
        storage.atomic_write_bytes(f"{root}/corpus/part-{i}.txt", text)
    total = n_files * len(text)
    http_calls.clear()
    units = plan_units(CorpusConfig(source=f"{root}/corpus/*.txt", validation_fraction=0.1),
                       ShardConfig(unit_bytes=64 * 1024), str(tmp_path / "run"))
    assert len(units) >= 4 * n_files
    planned = dict(http_calls)
    # One listing (a GET of the bucket's object list), then per file two batches of ranged reads
    # (boundaries, then split points): ~2 small GETs per unit, nothing per file besides.
    assert planned["GET"] <= 2 + 2 * len(units) and planned.get("bytes", 0) <= 0.15 * total, planned
    http_calls.clear()
    for unit in units:
        for _ in iter_chunks(unit):
            pass
    assert http_calls["GET"] == len(units) and http_calls["bytes"] == total, dict(http_calls)


@pytest.mark.quick
def test_a_gs_parquet_unit_gets_only_its_text_column(gcs_emulator, http_calls, tmp_path, small_corpus):
    """On the object store too: a parquet unit's GETs fetch its row groups' text column chunks
    (and the footer), not the other columns, not readahead."""
    from tpu_ray import storage

    local = tmp_path / "fw.parquet"
    lines, text_bytes = _parquet_with_html(small_corpus, local)
    root = gcs_emulator.make_bucket()
    storage.atomic_write_bytes(f"{root}/fw.parquet", local.read_bytes())
    units = plan_units(CorpusConfig(source=f"{root}/fw.parquet", validation_fraction=0.1),
                       ShardConfig(unit_bytes=16 * 1024), str(tmp_path / "run"))
    from tpu_ray.prepare import tabular

    tabular._FOOTERS.clear()
    http_calls.clear()
    got = [line for u in units for c in iter_chunks(u) for line in c.train + c.validation]
    assert got == [s.strip() for s in lines]
    assert text_bytes <= http_calls["bytes"] <= text_bytes + 128 * 1024, (dict(http_calls), text_bytes,
                                                                           local.stat().st_size)


def test_a_gs_pack_of_small_compressed_files_is_one_get_per_file(gcs_emulator, http_calls, tmp_path, small_corpus):
    """On the object store a packed member is fetched whole in one GET (no info request, no
    readahead block past its end): N files cost N GETs and exactly their stored bytes."""
    from tpu_ray import storage

    lines = [s.strip() for s in small_corpus.read_text().splitlines() if s.strip()][:2000]
    local = tmp_path / "c4"
    _jsonl_files(local, lines, 40)
    root = gcs_emulator.make_bucket()
    for path in sorted(local.iterdir()):
        storage.atomic_write_bytes(f"{root}/c4/{path.name}", path.read_bytes())
    stored = sum(p.stat().st_size for p in local.iterdir())
    units = plan_units(CorpusConfig(source=f"{root}/c4/*.jsonl.gz", validation_fraction=0.1),
                       ShardConfig(unit_bytes=4 << 20), str(tmp_path / "run"))
    assert sum(len(u.members) for u in units) == 40 and len(units) < 40
    http_calls.clear()
    got = [x for u in units for c in iter_chunks(u) for x in c.train + c.validation]
    assert got == lines
    assert http_calls["GET"] == 40 and http_calls["bytes"] == stored, dict(http_calls)


@pytest.mark.parametrize("suffix", [".txt.gz", ".txt.zst"])
@pytest.mark.quick
def test_small_files_that_hold_much_text_are_not_packed_together(tmp_path, suffix):
    """Files small as stored but holding many units of text each (repetitive text compresses 1,000x)
    are judged by the text size their own headers record (gzip ISIZE, zstd Frame_Content_Size):
    each stays its own unit, so the actors share the work (packed, one actor streamed all of it
    while the other idled: 0.49x plain text in the 1 GB benchmark)."""
    d = tmp_path / "rep"
    d.mkdir()
    body = b"the same line of text again and again\n" * 20_000  # 780 KB of text
    for i in range(6):
        data = gzip.compress(body) if suffix.endswith(".gz") else zstandard.ZstdCompressor().compress(body)
        (d / f"part-{i}{suffix}").write_bytes(data)
        assert len(data) < 16 * 1024  # small as stored: under half a 64 KiB unit
    units = plan_units(CorpusConfig(source=str(d)), ShardConfig(unit_bytes=64 * 1024), str(tmp_path / "run"))
    assert len(units) == 6 and not any(u.members for u in units)
    # A file whose writer did not record its size (a streamed zstd frame) is judged by its stored size.
    from tpu_ray.prepare.corpus import _zstd_content_size

    assert _zstd_content_size(zstandard.ZstdCompressor().compress(body)[:18]) == len(body)
    streamed = zstandard.ZstdCompressor().compressobj()
    assert _zstd_content_size((streamed.compress(body) + streamed.flush())[:18]) is None


@pytest.mark.quick
def test_a_gs_mixture_of_three_sources_costs_o_files_requests_and_is_read_once(gcs_emulator, http_calls, tmp_path,
                                                                              small_corpus):
    """Planning three named sources (two weighted, one evaluation only) is each source's
    listing plus its boundary reads; a second plan (the shard stage, a resume) reads no corpus byte;
    sharding reads every unit once, exactly the three sources' bytes (1.0x)."""
    from tpu_ray import storage
    from tpu_ray.config import RunConfig
    from tpu_ray.prepare.sources import all_units, plan_sources

    text = small_corpus.read_bytes()[:200_000]
    text = text[: text.rfind(b"\n") + 1]
    root = gcs_emulator.make_bucket()
    files = {"domain": 2, "general": 2, "held_out": 1}
    for name, n in files.items():
        for i in range(n):
            storage.atomic_write_bytes(f"{root}/{name}/part-{i}.txt", text)
    total = sum(files.values()) * len(text)
    cfg = RunConfig.from_dict({"output_dir": str(tmp_path / "run"), "shard": {"unit_bytes": 64 * 1024},
                               "corpus": {"sources": {
                                   "domain": {"source": f"{root}/domain/*.txt", "weight": 0.8},
                                   "general": {"source": f"{root}/general/*.txt", "weight": 0.2},
                                   "held_out": {"source": f"{root}/held_out/*.txt", "weight": 0}}}})
    http_calls.clear()
    planned = plan_sources(cfg.corpus, cfg.shard, cfg.run_dir)
    units = all_units(planned)
    assert [u.index for u in units] == list(range(len(units)))  # one numbering across the sources
    assert all(u.split_at == u.start for u in planned[2].units)  # evaluation only: all validation text
    first = dict(http_calls)
    assert first["GET"] <= 3 + 2 * len(units) and first.get("bytes", 0) <= 0.15 * total, first
    http_calls.clear()
    assert all_units(plan_sources(cfg.corpus, cfg.shard, cfg.run_dir)) == units  # the stored per-source plans are reused
    assert http_calls.get("bytes", 0) == 0 and http_calls["GET"] <= 3, dict(http_calls)
    http_calls.clear()
    for unit in units:
        for _ in iter_chunks(unit):
            pass
    assert http_calls["GET"] == len(units) and http_calls["bytes"] == total, dict(http_calls)
