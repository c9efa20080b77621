"""Real corpus formats: each shards to exactly the tokens of the same text as plain .txt.

Shards are made by the function every actor runs (`process_unit`, real tokenizer, real TFRecords);
test_a_c4_directory_shards_on_ray_like_plain_text runs the same through make_shards on a real local
Ray cluster. Corpora are ~300 KB of WikiText-2 shaped like C4 (.json.gz directory), the Pile
(.jsonl.zst), FineWeb (parquet with row groups and extra columns), a save_to_disk dataset and CSV.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import lzma
from pathlib import Path

import pytest

from tpu_ray.config import CorpusConfig, ShardConfig
from tpu_ray.errors import UserError
from tpu_ray.prepare.corpus import iter_chunks, plan_units, read_unit_text
from tpu_ray.prepare.shards import process_unit
from tpu_ray.prepare.tokenizer import describe, load_tokenizer_json

SEQ = 64


@pytest.fixture(scope="module")
def docs(small_corpus) -> list[str]:
    """Documents of one to three WikiText lines (so records hold newlines, as real ones do)."""
    lines = [s.strip() for s in small_corpus.read_text().splitlines() if s.strip()]
    out, i = [], 0
    while i < len(lines):
        k = 1 + i % 3
        out.append("\n".join(lines[i: i + k]))
        i += k
    return out


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from tokenizers import Tokenizer

    text = load_tokenizer_json(tiny_tokenizer_dir)
    return Tokenizer.from_str(text), describe(text, tiny_tokenizer_dir)


def _thirds(docs: list[str]) -> list[list[str]]:
    n = len(docs) // 3
    return [docs[:n], docs[n: 2 * n], docs[2 * n:]]


def shards_of(source: str, tmp: Path, tok, unit_bytes: int = 1 << 22, frac: float = 0.0, **corpus) -> list[bytes]:
    """The bytes of every shard, in plan order (train, then validation, per chunk)."""
    tokenizer, info = tok
    out = tmp / f"out-{len(list(tmp.glob('out-*')))}"
    units = plan_units(CorpusConfig(source=source, validation_fraction=frac, **corpus),
                       ShardConfig(unit_bytes=unit_bytes, seq_len=SEQ), str(tmp))
    data = []
    for unit in units:
        for entry in process_unit(unit, tokenizer, info, SEQ, str(out))["shards"]:
            data.append((out / entry["path"]).read_bytes())
    return data


def plain(tmp: Path, parts: list[list[str]], tok, **kwargs) -> list[bytes]:
    """The same documents as plain .txt files, one per part, each its own source (a directory of
    small files, plain or compressed, would be packed); `kwargs` go to shards_of."""
    d = tmp / "plain"
    d.mkdir(exist_ok=True)
    for i, part in enumerate(parts):
        (d / f"{i}.txt").write_text("\n".join(part) + "\n")
    return [data for i in range(len(parts)) for data in shards_of(str(d / f"{i}.txt"), tmp, tok, **kwargs)]


@pytest.mark.parametrize("suffix,opener", [(".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open),
                                           (".zst", None)])
def test_a_compressed_text_file_streams_into_the_shards_of_the_plain_file(suffix, opener, tmp_path, small_corpus,
                                                                          tok):
    """One unit, read once as a stream, cut into chunks at the plain file's unit boundaries: several
    shards, byte for byte those of the uncompressed file (validation tails included)."""
    data = small_corpus.read_bytes()
    path = tmp_path / f"c.txt{suffix}"
    if opener is None:
        import zstandard

        path.write_bytes(zstandard.ZstdCompressor().compress(data))
    else:
        with opener(path, "wb") as f:
            f.write(data)
    want = shards_of(str(small_corpus), tmp_path, tok, unit_bytes=64 * 1024, frac=0.1)
    got = shards_of(str(path), tmp_path, tok, unit_bytes=64 * 1024, frac=0.1)
    assert len(want) >= 8 and got == want
    units = plan_units(CorpusConfig(source=str(path)), ShardConfig(unit_bytes=64 * 1024), str(tmp_path))
    assert len(units) == 1 and units[0].compression  # one streamed unit for the whole file


def test_a_multi_frame_zstd_file_is_read_to_its_end(tmp_path, small_corpus, tok):
    """pzstd and concatenated .zst files hold several frames: every frame is text (fsspec's own
    zstandard reader would stop silently after a truncated frame; ours reads on and checks each)."""
    import zstandard

    data = small_corpus.read_bytes()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    path = tmp_path / "m.txt.zst"
    path.write_bytes(b"".join(zstandard.ZstdCompressor().compress(data[a:b]) for a, b in zip(cut, cut[1:])))
    assert shards_of(str(path), tmp_path, tok, unit_bytes=64 * 1024, frac=0.1) == shards_of(
        str(small_corpus), tmp_path, tok, unit_bytes=64 * 1024, frac=0.1)


def test_a_c4_shaped_directory_of_json_gz_shards_like_plain_text(tmp_path, docs, tok):
    c4 = tmp_path / "c4"
    c4.mkdir()
    for i, part in enumerate(_thirds(docs)):
        with gzip.open(c4 / f"c4-train.{i:05d}-of-00003.json.gz", "wt") as f:
            for doc in part:
                f.write(json.dumps({"text": doc, "timestamp": "2019-04-25T12:57:54Z", "url": "https://x"}) + "\n")
    want = plain(tmp_path, [docs], tok)  # three small files: packed into one unit, read as one text
    assert shards_of(str(c4), tmp_path, tok) == want  # the directory
    assert shards_of(str(c4 / "*.json.gz"), tmp_path, tok) == want  # a glob


def _small_files(d: Path, docs: list[str], suffix: str, n: int = 200) -> dict[str, list[str]]:
    """`docs` in `n` consecutive JSON-lines files compressed by `suffix` (C4's shape, small);
    returns each file's documents by path."""
    import zstandard

    d.mkdir()
    out = {}
    for i in range(n):
        part = docs[len(docs) * i // n: len(docs) * (i + 1) // n]
        data = "".join(json.dumps({"text": doc, "url": f"https://x/{i}"}) + "\n" for doc in part).encode()
        path = d / f"c4-{i:04d}{suffix}"
        path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else zstandard.ZstdCompressor().compress(data))
        out[str(path)] = part
    return out


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_a_directory_of_small_compressed_files_packs_and_shards_like_plain_text(suffix, tmp_path, docs, tok):
    """200 small compressed files pack into a few units (not 200 units and shard pairs); a unit
    streams its files one after another and shards exactly like one plain .txt of their text:
    chunk boundaries (several per unit) and validation tails included."""
    files = _small_files(tmp_path / "c4", docs, suffix)
    shard = ShardConfig(unit_bytes=64 * 1024)
    units = plan_units(CorpusConfig(source=str(tmp_path / "c4")), shard, str(tmp_path))
    assert 2 <= len(units) <= 8 and all(u.streamed and len(u.members) > 10 for u in units), len(units)
    assert [p for u in units for p, _ in u.members] == sorted(files)  # every file once, in listing order
    got = shards_of(str(tmp_path / "c4"), tmp_path, tok, unit_bytes=64 * 1024, frac=0.1)
    want = plain(tmp_path, [[doc for p, _ in u.members for doc in files[p]] for u in units], tok,
                 unit_bytes=64 * 1024, frac=0.1)
    assert got == want and len(want) >= 2 * len(units)  # a train + a validation shard for every chunk


@pytest.mark.quick
def test_a_packed_unit_holds_one_chunk_of_text_not_its_files_decompressed(tmp_path, small_corpus):
    """Packing judges a compressed file that records no text size (bz2, xz, a streamed zstd frame)
    by its stored size; a pack that decompresses to many times a unit comes out as many chunks of
    about unit_bytes of text each, and reading it holds about one chunk in memory, not the files' text."""
    import bz2
    import tracemalloc

    text = small_corpus.read_text()[:20_000]
    text = text[: text.rfind("\n") + 1] * 30  # compresses ~50x: the stored size says little
    d = tmp_path / "many"
    d.mkdir()
    for i in range(4):  # ~12 KB each as stored, 600 KB of text
        (d / f"{i:02d}.txt.bz2").write_bytes(bz2.compress(f"file {i}\n{text}".encode()))
    unit_bytes = 64 * 1024
    units = plan_units(CorpusConfig(source=str(d), validation_fraction=0.1), ShardConfig(unit_bytes=unit_bytes),
                       str(tmp_path))
    assert len(units) == 1 and len(units[0].members) == 4
    total = 4 * len(text)
    sizes = []
    tracemalloc.start()
    try:
        for chunk in iter_chunks(units[0]):
            sizes.append(sum(len(line) + 1 for line in chunk.train + chunk.validation))
            del chunk
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(sizes) >= total // unit_bytes - 1 and max(sizes) <= unit_bytes * 1.05, (len(sizes), max(sizes))
    assert peak <= 6 * unit_bytes < total // 6, (peak, total)


def test_a_pile_shaped_jsonl_zst_shards_like_plain_text(tmp_path, docs, tok):
    import zstandard

    lines = "".join(json.dumps({"text": d, "meta": {"pile_set_name": "Wikipedia (en)"}}) + "\n" for d in docs)
    path = tmp_path / "00.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    assert shards_of(str(path), tmp_path, tok) == plain(tmp_path, [docs], tok)


def _fineweb(path: Path, docs: list[str], rows_per_group: int = 40) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"text": docs, "id": [f"<urn:uuid:{i}>" for i in range(len(docs))],
                      "url": ["https://example.org"] * len(docs), "language_score": [0.9] * len(docs),
                      "token_count": list(range(len(docs)))})
    pq.write_table(table, path, row_group_size=rows_per_group)


def test_a_fineweb_shaped_parquet_shards_like_plain_text_by_row_groups(tmp_path, docs, tok):
    from tpu_ray.prepare.tabular import parquet_groups

    path = tmp_path / "000_00000.parquet"
    _fineweb(path, docs, rows_per_group=10)
    assert shards_of(str(path), tmp_path, tok) == plain(tmp_path, [docs], tok)
    # Small units: whole row groups, each group in exactly one unit, about unit_bytes of text each.
    groups = parquet_groups(str(path), "text")
    units = plan_units(CorpusConfig(source=str(path)), ShardConfig(unit_bytes=16 * 1024), str(tmp_path))
    assert len(groups) > 20 and 4 <= len(units) < len(groups)
    assert [(u.start, u.end) for u in units] == list(zip([u.start for u in units], [u.start for u in units[1:]]
                                                         + [len(groups)]))
    assert units[0].start == 0
    # Every document once, in order, whatever the packing.
    text = [line for u in units for line in read_unit_text(u, "all")]
    assert text == [line for d in docs for line in d.split("\n")]


@pytest.mark.parametrize("kind", ["Dataset", "DatasetDict"])
def test_a_save_to_disk_dataset_shards_like_plain_text(kind, tmp_path, docs, tok):
    import datasets

    ds = datasets.Dataset.from_dict({"text": docs, "id": list(range(len(docs)))})
    if kind == "DatasetDict":
        ds = datasets.DatasetDict({"train": ds, "test": ds.select(range(5))})
    ds.save_to_disk(str(tmp_path / "saved"))
    want = plain(tmp_path, [docs], tok)
    assert shards_of(str(tmp_path / "saved"), tmp_path, tok) == want
    # Inside a corpus directory: the dataset, never its .json metadata or .arrow files as text.
    (tmp_path / "root").mkdir()
    (tmp_path / "saved").rename(tmp_path / "root" / "saved")
    assert shards_of(str(tmp_path / "root"), tmp_path, tok) == want


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_a_csv_or_tsv_is_a_table_with_a_text_column_and_shards_like_plain_text(fmt, tmp_path, docs, tok):
    path = tmp_path / f"t.{fmt}"
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="," if fmt == "csv" else "\t")
        w.writerow(["id", "text", "url"])
        for i, doc in enumerate(docs):
            w.writerow([i, doc, "https://example.org/a,b"])
    assert shards_of(str(path), tmp_path, tok) == plain(tmp_path, [docs], tok)


def test_hf_names_read_the_data_files_datasets_resolves(tmp_path, docs, tok):
    """`hf:NAME` plans the data files `datasets` resolves (on the Hub: hf://datasets/... URLs read by
    huggingface_hub's fsspec filesystem). Here NAME is a local dataset directory, the same code
    path without network; the packaged builders (hf:csv with its files) still read via datasets."""
    repo = tmp_path / "repo" / "data"
    repo.mkdir(parents=True)
    _fineweb(repo / "train-00000-of-00001.parquet", docs)
    want = plain(tmp_path, [docs], tok)
    units = plan_units(CorpusConfig(source=f"hf:{tmp_path / 'repo'}"), ShardConfig(), str(tmp_path))
    assert {u.fmt for u in units} == {"parquet"}
    assert shards_of(f"hf:{tmp_path / 'repo'}", tmp_path, tok) == want
    path = tmp_path / "t.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text"])
        w.writerows([d] for d in docs)
    assert shards_of("hf:csv", tmp_path, tok, hf_config=str(path)) == want
    tsv = tmp_path / "t.tsv"  # a TSV through hf:csv once failed with a generic datasets error
    with open(tsv, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["text"])
        w.writerows([d] for d in docs)
    assert shards_of("hf:csv", tmp_path, tok, hf_config=str(tsv)) == want


def test_compressed_and_parquet_corpora_on_gs_shard_like_local_ones(gcs_emulator, tmp_path, docs, tok):
    """The readers go through `storage` (fsspec): the same bytes from the GCS emulator as from disk."""
    from tpu_ray import storage

    bucket = gcs_emulator.make_bucket()
    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(lines))
    _fineweb(tmp_path / "b.parquet", docs, rows_per_group=25)
    for name in ("a.jsonl.gz", "b.parquet"):
        storage.atomic_write_bytes(f"{bucket}/c/{name}", (tmp_path / name).read_bytes())
        local = shards_of(str(tmp_path / name), tmp_path, tok, unit_bytes=64 * 1024, frac=0.1)
        assert len(local) > 4 and shards_of(f"{bucket}/c/{name}", tmp_path, tok, unit_bytes=64 * 1024,
                                            frac=0.1) == local, name


@pytest.mark.quick
def test_max_bytes_is_honoured_by_every_reader(tmp_path, docs):
    """corpus.max_bytes caps what each source file gives: decompressed bytes (compressed text),
    text bytes (CSV, datasets), whole row groups (parquet)."""
    import datasets

    cap = 20_000
    full = sum(len(d.encode()) + 1 for d in docs)
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(("\n".join(docs) + "\n").encode()))
    with open(tmp_path / "a.csv", "w", newline="") as f:
        csv.writer(f).writerows([["text"]] + [[d] for d in docs])
    _fineweb(tmp_path / "a.parquet", docs)
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "saved"))
    for source in ("a.txt.gz", "a.csv", "a.parquet", "saved"):
        units = plan_units(CorpusConfig(source=str(tmp_path / source), validation_fraction=0, max_bytes=cap),
                           ShardConfig(), str(tmp_path))
        read = sum(len(line.encode()) + 1 for u in units for line in read_unit_text(u, "all"))
        assert cap * 0.9 <= read <= cap * 1.6 < full, (source, read)
    # Small compressed files pack under the cap: it applies to each file while the pack streams.
    (tmp_path / "packed").mkdir()
    for i in range(3):
        (tmp_path / "packed" / f"{i}.txt.gz").write_bytes((tmp_path / "a.txt.gz").read_bytes())
    units = plan_units(CorpusConfig(source=str(tmp_path / "packed"), validation_fraction=0, max_bytes=cap),
                       ShardConfig(), str(tmp_path))
    read = sum(len(line.encode()) + 1 for u in units for line in read_unit_text(u, "all"))
    assert len(units) == 1 and len(units[0].members) == 3 and 3 * cap * 0.9 <= read <= 3 * cap * 1.6, read


@pytest.mark.quick
def test_max_rows_is_honoured_by_every_reader(tmp_path, docs):
    """corpus.max_rows gives each source file's first N records, whatever its format: lines of
    .txt (plain too: then streamed from its start), records of JSON lines and CSV, rows of parquet
    (inside a row group) and datasets."""
    import datasets

    cap = 37  # not a multiple of any row group or batch size
    docs = [d.replace("\n", " ") for d in docs if d.strip()]
    want = [d.strip() for d in docs[:cap]]
    (tmp_path / "a.txt").write_text("\n".join(docs) + "\n")
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(("\n".join(docs) + "\n").encode()))
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    with open(tmp_path / "d.csv", "w", newline="") as f:
        csv.writer(f).writerows([["text"]] + [[d] for d in docs])
    _fineweb(tmp_path / "e.parquet", docs, rows_per_group=10)
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "saved"))
    for source in ("a.txt", "b.txt.gz", "c.jsonl", "d.csv", "e.parquet", "saved"):
        got = _read_all(str(tmp_path / source), tmp_path / f"run-{source}", max_rows=cap, validation_fraction=0)
        assert got == want, source
    # Several files: the cap is per file; small plain files are not packed past it.
    many = tmp_path / "many"
    many.mkdir()
    for i in range(3):
        (many / f"{i}.txt").write_text("\n".join(docs[i * 50:(i + 1) * 50]) + "\n")
    got = _read_all(str(many), tmp_path / "run-many", max_rows=5, validation_fraction=0)
    assert got == [d.strip() for i in range(3) for d in docs[i * 50:i * 50 + 5]]
    # Small compressed files are packed (streamed): the cap applies to each file of the pack.
    for i in range(3):
        (many / f"{i}.txt.gz").write_bytes(gzip.compress((many / f"{i}.txt").read_bytes()))
        (many / f"{i}.txt").unlink()
    units = plan_units(CorpusConfig(source=str(many), max_rows=5), ShardConfig(), str(tmp_path / "run-manyz"))
    assert len(units) == 1 and len(units[0].members) == 3
    assert _read_all(str(many), tmp_path / "run-manyz", max_rows=5, validation_fraction=0) == got


# --------------------------------------------------------------------------------------------
# Bad input, one line each
# --------------------------------------------------------------------------------------------
def _read_all(source: str, tmp: Path, **corpus) -> list[str]:
    units = plan_units(CorpusConfig(source=source, **corpus), ShardConfig(), str(tmp))
    return [line for u in units for line in read_unit_text(u, "all")]


@pytest.mark.quick
def test_bad_input_in_each_format_is_one_line_naming_file_and_record(tmp_path, docs):
    import zstandard

    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    gz = gzip.compress(lines)
    (tmp_path / "cut.json.gz").write_bytes(gz[: len(gz) // 2])
    zst = zstandard.ZstdCompressor().compress(lines)
    (tmp_path / "cut.jsonl.zst").write_bytes(zst[: len(zst) // 2])
    _fineweb(tmp_path / "ok.parquet", docs)
    raw = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "footer.parquet").write_bytes(raw[:-100] + b"\0" * 100)
    (tmp_path / "nohead.csv").write_text("1,some text,https://x\n2,more text,https://y\n")
    (tmp_path / "x.txt.lz4").write_bytes(b"\x04\x22\x4d\x18 whatever")
    cases = [
        ("cut.json.gz", {}, r"cut.json.gz: after line \d+: gzip stream is damaged or cut short \(Compressed file "
                            r"ended before the end-of-stream marker was reached\); re-download"),
        ("cut.jsonl.zst", {}, r"cut.jsonl.zst: after line \d+: zstd stream is damaged or cut short"),
        ("footer.parquet", {}, r"footer.parquet: not a readable parquet file \(.*\); fix or remove it"),
        ("ok.parquet", {"text_field": "content"},
         r"ok.parquet: no column 'content' \(columns: text, id, url, language_score, token_count\); "
         r"set corpus.text_field"),
        ("nohead.csv", {}, r"nohead.csv: line 1: the header row has no column 'text' \(it has '1', 'some text', "
                           r"'https://x'\); a CSV/TSV needs a header naming its columns"),
        ("x.txt.lz4", {}, r"x.txt.lz4: compression/archive '.lz4' is not supported; decompress it, or recompress"),
    ]
    for name, corpus, needle in cases:
        with pytest.raises(UserError, match=needle) as info:
            _read_all(str(tmp_path / name), tmp_path, **corpus)
        assert "\n" not in str(info.value), name


@pytest.mark.quick
def test_a_hub_name_without_network_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match=r"corpus.source='hf:someone/no-such-corpus' \(hf_config=None\): cannot "
                                        r"resolve the dataset's files: .*; check the name and the network") as info:
        _read_all("hf:someone/no-such-corpus", tmp_path)
    assert "\n" not in str(info.value)


@pytest.mark.quick
def test_the_cli_refuses_a_truncated_corpus_with_exit_2(tmp_path, docs, capsys, monkeypatch):
    from tpu_ray.cli import main

    gz = gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in docs).encode())
    (tmp_path / "cut.json.gz").write_bytes(gz[: len(gz) // 2])
    monkeypatch.chdir(tmp_path)
    code = main(["tokenizer", "--corpus", str(tmp_path / "cut.json.gz"), "--output-dir", str(tmp_path / "out"),
                 "tokenizer.vocab_size=100"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "cut.json.gz: after line" in err[0], err


@pytest.mark.slow
def test_a_c4_shaped_corpus_runs_end_to_end_and_trains(tmp_path, docs, ray_local, capsys):
    """`tpu-ray run` on a directory of .json.gz, trained on: tokenizer, shards on Ray
    actors, training and export; the shard line counts the records whose text was null."""
    from tpu_ray.cli import main

    c4 = tmp_path / "c4"
    c4.mkdir()
    for i, part in enumerate(_thirds(docs)):
        with gzip.open(c4 / f"c4-train.{i:05d}-of-00003.json.gz", "wt") as f:
            for j, doc in enumerate(part):
                f.write(json.dumps({"text": None if j == 0 else doc, "url": "https://x"}) + "\n")
    run = tmp_path / "run"
    code = main(["run", "--corpus", str(c4), "--output-dir", str(run), "tokenizer.vocab_size=800",
                 "shard.seq_len=64", "shard.unit_bytes=65536", "train.steps=20", "train.batch_size=16",
                 "train.warmup_steps=2", "train.eval_every=10", "eval.samples=32", "train.checkpoint_every=10",
                 "model.preset=tiny"])
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((run / "shards" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["skipped_records"] == 3
    assert len(manifest["splits"]["train"]["shards"]) > 3  # three files, each several chunks
    summary = json.loads((run / "summary.json").read_text())
    assert (run / "model" / "tf_model.h5").exists() and summary
