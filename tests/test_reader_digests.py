"""Every format's shards stay byte-identical across the move to one reader class per format.

A small corpus of each format (and of each way a format is planned: byte ranges, packs, streams,
row groups, rows, caps) is planned and sharded by the function every actor runs (`process_unit`,
the suite's real tokenizer, real TFRecords); the digest of its plan and of every shard it writes
is compared to the digest recorded from the code before the readers were classes
(tests/reader_digests.json). Record again (only on purpose) with TPU_RAY_RECORD_DIGESTS=1.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest

from tpu_ray.config import CorpusConfig, ShardConfig
from tpu_ray.prepare.corpus import plan_units
from tpu_ray.prepare.shards import process_unit
from tpu_ray.prepare.tokenizer import describe, load_tokenizer_json

SEQ = 64
RECORDED = Path(__file__).with_name("reader_digests.json")


@pytest.fixture(scope="module")
def docs(small_corpus) -> list[str]:
    """~60 KB of documents of one to three lines, a few records without text (null, missing)."""
    lines = [s.strip() for s in small_corpus.read_text().splitlines() if s.strip()]
    out, i = [], 0
    while i < len(lines) and sum(map(len, out)) < 60_000:
        k = 1 + i % 3
        out.append("\n".join(lines[i: i + k]))
        i += k
    return out


@pytest.fixture(scope="module")
def tok(tmp_path_factory, small_corpus):
    """A BPE tokenizer (its trainer is exact in every process; a Unigram one is made repeatable only
    up to a rare rounding tie): the same tokens in every session, so shard digests can be recorded."""
    from tokenizers import Tokenizer

    from tpu_ray.config import TokenizerConfig
    from tpu_ray.prepare.tokenizer import save_tokenizer, train_tokenizer

    lines = [s for s in small_corpus.read_text().splitlines() if s.strip()]
    path = str(tmp_path_factory.mktemp("bpe") / "tokenizer")
    save_tokenizer(train_tokenizer([lines], TokenizerConfig(vocab_size=800, kind="bpe")), path, SEQ)
    text = load_tokenizer_json(path)
    return Tokenizer.from_str(text), describe(text, path)


def _jsonl(docs: list[str]) -> str:
    out = []
    for i, d in enumerate(docs):
        record: dict = {"text": d, "id": i}
        if i % 37 == 5:
            record["text"] = None
        elif i % 41 == 7:
            record = {"id": i}
        out.append(json.dumps(record))
    return "\n".join(out) + "\n"


def _zst(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


def _table(path: Path, docs: list[str], delimiter: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(["id", "text"])
        for i, d in enumerate(docs):
            w.writerow([i, d] if i % 29 != 3 else [i])  # a short row: skipped and counted


def _build(root: Path, docs: list[str]) -> dict[str, tuple[str, dict]]:
    """name -> (source, corpus overrides) of every case, written under `root`."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = "\n".join(docs) + "\n"
    cases: dict[str, tuple[str, dict]] = {}
    (root / "one.txt").write_text(text)
    cases["txt"] = (str(root / "one.txt"), {})
    cases["txt_max_bytes"] = (str(root / "one.txt"), {"max_bytes": 20_000})
    cases["txt_max_rows"] = (str(root / "one.txt"), {"max_rows": 120})
    small = root / "small"
    small.mkdir()
    for i in range(12):
        (small / f"{i:02d}.txt").write_text("\n".join(docs[i::12]) + "\n")
    cases["txt_packed"] = (str(small), {})
    (root / "one.txt.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    cases["txt_gz"] = (str(root / "one.txt.gz"), {})
    gz = root / "gz"
    gz.mkdir()
    for i in range(12):
        (gz / f"{i:02d}.jsonl.gz").write_bytes(gzip.compress(_jsonl(docs[i::12]).encode(), mtime=0))
    cases["jsonl_gz_packed"] = (str(gz), {})
    cases["jsonl_gz_packed_max_rows"] = (str(gz), {"max_rows": 5})
    (root / "one.jsonl").write_text(_jsonl(docs))
    cases["jsonl"] = (str(root / "one.jsonl"), {})
    cases["jsonl_max_rows"] = (str(root / "one.jsonl"), {"max_rows": 50})
    js = root / "js"
    js.mkdir()
    for i in range(6):
        (js / f"{i}.jsonl").write_text(_jsonl(docs[i::6]))
    cases["jsonl_packed"] = (str(js / "*.jsonl"), {})
    (root / "one.jsonl.zst").write_bytes(_zst(_jsonl(docs).encode()))
    cases["jsonl_zst"] = (str(root / "one.jsonl.zst"), {})
    cases["jsonl_zst_max_bytes"] = (str(root / "one.jsonl.zst"), {"max_bytes": 25_000})
    _table(root / "one.csv", docs, ",")
    cases["csv"] = (str(root / "one.csv"), {})
    _table(root / "one.tsv", docs, "\t")
    cases["tsv"] = (str(root / "one.tsv"), {})
    cases["tsv_max_rows"] = (str(root / "one.tsv"), {"max_rows": 30})
    values = [d if i % 31 != 4 else None for i, d in enumerate(docs)]
    pq.write_table(pa.table({"text": values, "id": list(range(len(docs)))}), root / "one.parquet",
                   row_group_size=25)
    cases["parquet"] = (str(root / "one.parquet"), {})
    cases["parquet_max_rows"] = (str(root / "one.parquet"), {"max_rows": 37})
    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_dict({"text": values, "id": list(range(len(docs)))})
    ds.save_to_disk(str(root / "saved"))
    cases["hf_disk"] = (str(root / "saved"), {})
    cases["hf_disk_max_rows"] = (str(root / "saved"), {"max_rows": 41})
    datasets.DatasetDict({"train": ds, "test": ds.select(range(9))}).save_to_disk(str(root / "saved_dict"))
    cases["hf_disk_dict"] = (str(root / "saved_dict"), {"hf_split": "test"})
    cases["hf_json"] = ("hf:json", {"hf_config": str(root / "one.jsonl")})
    hub = root / "hub" / "data"
    hub.mkdir(parents=True)
    pq.write_table(pa.table({"text": docs}), hub / "train-00000-of-00001.parquet", row_group_size=40)
    cases["hf_hub_files"] = (f"hf:{root / 'hub'}", {})
    cases["validation_source"] = (str(root / "one.txt"), {"validation_source": str(root / "one.tsv")})
    mixed = root / "mixed"
    mixed.mkdir()
    (mixed / "a.txt").write_text("\n".join(docs[:50]) + "\n")
    (mixed / "b.jsonl").write_text(_jsonl(docs[50:100]))
    (mixed / "c.txt.gz").write_bytes(gzip.compress(("\n".join(docs[100:150]) + "\n").encode(), mtime=0))
    (mixed / "d.jsonl.gz").write_bytes(gzip.compress(_jsonl(docs[150:200]).encode(), mtime=0))
    (mixed / "e.csv").write_text("text\n" + "".join(f'"{d}"\n' for d in docs[200:210]))
    cases["mixed_dir"] = (str(mixed), {})
    cases["builtin"] = ("builtin:python-docs", {"max_bytes": 40_000})
    return cases


def _digest(source: str, extra: dict, root: Path, tok) -> str:
    """sha256 of the plan (paths relative to `root`) and of every shard's bytes and counts."""
    tokenizer, info = tok
    out = root / f"out-{hashlib.sha256(json.dumps([source, extra]).encode()).hexdigest()[:12]}"
    units = plan_units(CorpusConfig(source=source, validation_fraction=0.1, **extra),
                       ShardConfig(unit_bytes=16 * 1024, unit_rows=70, seq_len=SEQ), str(out))
    h = hashlib.sha256()
    for unit in units:
        h.update(json.dumps(unit.key(), default=list).replace(str(root), "ROOT").encode())
        result = process_unit(unit, tokenizer, info, SEQ, str(out / "shards"))
        h.update(json.dumps([result["tokens"], result["dropped_tokens"], result["skipped_records"]]).encode())
        for entry in result["shards"]:
            h.update(f"{entry['path']} {entry['samples']} {entry['sha256']}".encode())
    return h.hexdigest()


def test_every_format_shards_to_the_bytes_recorded_before_the_readers_were_classes(tmp_path, docs, tok):
    cases = _build(tmp_path, docs)
    got = {name: _digest(source, extra, tmp_path, tok) for name, (source, extra) in cases.items()}
    if os.environ.get("TPU_RAY_RECORD_DIGESTS") == "1":
        RECORDED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(RECORDED.read_text())
    assert set(got) == set(want)
    assert {k: v for k, v in got.items() if v != want[k]} == {}
