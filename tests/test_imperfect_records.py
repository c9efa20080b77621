"""Records as real corpora hold them: missing fields anywhere, a few broken records,
multi-member gzip, byte-order marks and other encodings.

Real files, the real planner and readers, the function every shard actor runs (`process_unit`,
real tokenizer, real TFRecords), and real local Ray for the shard pass itself.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tpu_ray.config import CorpusConfig, ShardConfig
from tpu_ray.errors import UserError
from tpu_ray.prepare.bad_records import BAD_FILE, check_corpus
from tpu_ray.prepare.corpus import iter_chunks, iter_train_text, plan_units, read_unit_text
from tpu_ray.prepare.shards import process_unit
from tpu_ray.prepare.streams import Counts
from tpu_ray.prepare.tokenizer import describe, load_tokenizer_json

SEQ = 64


@pytest.fixture(scope="module")
def lines(small_corpus) -> list[str]:
    return [s.strip() for s in small_corpus.read_text().splitlines() if s.strip()]


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from tokenizers import Tokenizer

    text = load_tokenizer_json(tiny_tokenizer_dir)
    return Tokenizer.from_str(text), describe(text, tiny_tokenizer_dir)


def _shard_all(units, tok, out: Path) -> dict[int, dict]:
    """Every unit through process_unit (what the actors run): results by unit index."""
    tokenizer, info = tok
    return {u.index: process_unit(u, tokenizer, info, SEQ, str(out)) for u in units}


# ---- 1. a missing text field, wherever it stands ------------------------------------------------
@pytest.mark.parametrize("where", ["first", "last"])
def test_records_without_the_field_are_skipped_and_counted_wherever_they_stand(where, tmp_path, lines, tok):
    """Before, 120 field-less records first (4 units) were refused, the same last
    went through. Both now read every good record, skip and count the 120, by file kind."""
    good = [json.dumps({"text": t}) for t in lines[:2000]]
    bad = [json.dumps({"title": f"no text {i}", "id": i}) for i in range(120)]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(bad + good if where == "first" else good + bad) + "\n")
    units = plan_units(CorpusConfig(source=str(path), validation_fraction=0.0),
                       ShardConfig(unit_bytes=len(path.read_bytes()) // 4 + 1, seq_len=SEQ), str(tmp_path / "r"))
    assert len(units) >= 4
    assert [x for u in units for x in read_unit_text(u, "all")] == lines[:2000]
    results = _shard_all(units, tok, tmp_path / "out")
    assert sum(r["skipped_records"] for r in results.values()) == 120
    assert check_corpus(results, "text", 0.001, str(tmp_path / "out")) == 0  # no refusal: the corpus is valid
    kinds: dict[str, int] = {}
    for r in results.values():
        for k, n in r["skipped_by_kind"].items():
            kinds[k] = kinds.get(k, 0) + n
    assert kinds == {"jsonl": 120}
    assert next(iter_train_text(units, 1 << 30))  # the tokenizer's sample reads it too


@pytest.mark.quick
def test_a_packed_file_whose_records_all_lack_the_field_is_skipped_not_refused(tmp_path, lines):
    d = tmp_path / "c4"
    d.mkdir()
    for i in range(6):
        key = "body" if i < 2 else "text"  # the first two files: no record has "text"
        body = "".join(json.dumps({key: t}) + "\n" for t in lines[i * 50:(i + 1) * 50])
        (d / f"{i:02d}.jsonl.gz").write_bytes(gzip.compress(body.encode()))
    units = plan_units(CorpusConfig(source=str(d), validation_fraction=0.0), ShardConfig(), str(tmp_path / "r"))
    assert len(units) == 1 and len(units[0].members) == 6
    counts = Counts()
    got = [x for c in iter_chunks(units[0], counts) for x in c.train]
    assert got == lines[100:300] and counts.skipped == 100 and counts.by_kind == {"jsonl": 100}


def test_a_corpus_where_no_record_has_the_field_is_refused_once_naming_the_fields_found(tmp_path, lines, tok):
    d = tmp_path / "c"
    d.mkdir()
    for i in range(3):
        (d / f"{i}.jsonl").write_text("".join(json.dumps({"content": t, "url": "u"}) + "\n"
                                              for t in lines[i * 200:(i + 1) * 200]))
    units = plan_units(CorpusConfig(source=str(d), validation_fraction=0.0),
                       ShardConfig(unit_bytes=8192, seq_len=SEQ), str(tmp_path / "r"))
    assert len(units) > 3
    results = _shard_all(units, tok, tmp_path / "out")  # no unit fails on its own
    match = r"0\.jsonl: byte 0: record has no field 'text' \(fields: content, url\); set corpus.text_field .*600 read"
    with pytest.raises(UserError, match=match):
        check_corpus(results, "text", 0.001, str(tmp_path / "out"))
    with pytest.raises(UserError, match=r"record has no field 'text' \(fields: content, url\)"):
        iter_train_text(units, 1 << 30)


@pytest.mark.quick
def test_the_preflight_warns_of_a_typod_field_without_failing_a_valid_corpus(tmp_path, lines, caplog):
    """The typo'd-field help stays, as a warning before any stage: the corpus may still have the
    field further on (here it does), so nothing is refused."""
    from tpu_ray.config import RunConfig
    from tpu_ray.prepare.preflight import preflight_corpus

    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(lines[:200]))
                    + "".join(json.dumps({"text": t}) + "\n" for t in lines[200:400]))
    cfg = RunConfig.from_dict({"name": "t", "output_dir": str(tmp_path / "run"), "corpus": {"source": str(path)}})
    with caplog.at_level("WARNING", logger="tpu_ray.prepare.corpus"):
        assert preflight_corpus(cfg.corpus) == [str(path)]
    assert "none of the" in caplog.text and "has field 'text'" in caplog.text and "fields: body, id" in caplog.text


# ---- 2. broken records: fail (default) or skip, counted, listed, bounded ------------------------
def _with_cut_records(path: Path, lines: list[str], every: int) -> list[str]:
    """A JSON-lines file where every `every`-th record is cut mid-line; returns the good texts."""
    out, good = [], []
    for i, t in enumerate(lines):
        record = json.dumps({"text": t, "id": i})
        if i % every == every - 1:
            out.append(record[: len(record) // 2])
        else:
            out.append(record)
            good.append(t)
    path.write_text("\n".join(out) + "\n")
    return good


def test_a_cut_record_fails_the_pass_by_default_and_is_skipped_and_listed_under_skip(tmp_path, lines, tok):
    path = tmp_path / "c.jsonl"
    good = _with_cut_records(path, lines[:760], 190)  # 4 cut records of 760
    with pytest.raises(UserError, match=r"c.jsonl: byte \d+: not a JSON line .*corpus.bad_records=skip"):
        for u in plan_units(CorpusConfig(source=str(path)), ShardConfig(unit_bytes=16384), str(tmp_path / "a")):
            list(iter_chunks(u))
    corpus = CorpusConfig(source=str(path), validation_fraction=0.0, bad_records="skip", max_bad_fraction=0.01)
    units = plan_units(corpus, ShardConfig(unit_bytes=16384, seq_len=SEQ), str(tmp_path / "b"))
    assert [x for u in units for x in read_unit_text(u, "all")] == good
    out = tmp_path / "out"
    results = _shard_all(units, tok, out)
    assert check_corpus(results, "text", 0.01, str(out)) == 4
    listed = [json.loads(line) for line in (out / BAD_FILE).read_text().splitlines()]
    assert [b["file"] for b in listed] == [str(path)] * 4
    assert all(b["reason"].startswith("not a JSON line") and b["where"].startswith("byte ") for b in listed)
    assert [b["unit"] for b in listed] == sorted(b["unit"] for b in listed)
    # Past the fraction: the pass fails naming the count and the list.
    with pytest.raises(UserError, match=rf"4 bad records of 760 \(0.526%\) exceed corpus.max_bad_fraction=0.001; "
                                        rf"they are listed in {out / BAD_FILE}"):
        check_corpus(results, "text", 0.001, str(out))


@pytest.mark.quick
def test_bad_records_in_compressed_streams_and_packs_name_their_file_and_line(tmp_path, lines):
    d = tmp_path / "c4"
    d.mkdir()
    for i in range(3):
        body = "".join(json.dumps({"text": t}) + "\n" for t in lines[i * 40:(i + 1) * 40])
        body += '{"text": "cut\n' + '{"text": 12}\n' + "[1, 2]\n"
        (d / f"{i}.jsonl.gz").write_bytes(gzip.compress(body.encode()))
    units = plan_units(CorpusConfig(source=str(d), bad_records="skip"), ShardConfig(), str(tmp_path / "r"))
    counts = Counts()
    assert [x for u in units for c in iter_chunks(u, counts) for x in c.train + c.validation] == lines[:120]
    assert [(b["file"].rsplit("/", 1)[-1], b["where"]) for b in counts.bad] == [
        (f"{i}.jsonl.gz", f"line {n}") for i in range(3) for n in (41, 42, 43)]
    assert [b["reason"].split(" (")[0] for b in counts.bad[:3]] == [
        "not a JSON line", "field 'text' is a number, not text", "a JSON list, not an object"]
    assert counts.records == 129


# ---- 3. multi-member gzip: a trailer that cannot describe its file is not believed ---------------
@pytest.mark.quick
def test_a_multi_member_gzip_is_never_packed_by_its_last_members_size(tmp_path, lines):
    """Before, a small file holding much text in one member plus a tiny last member
    (`cat a.gz b.gz`) was sized by the tiny member's ISIZE and packed with others into one unit
    of several units of text. It now stands alone; its neighbours still pack."""
    text = ("\n".join(lines[:100]) + "\n").encode()
    assert 20_000 < len(text) < 60_000
    d = tmp_path / "gz"
    d.mkdir()
    unit_bytes = 256 * 1024
    for i in range(9):
        (d / f"{i}.txt.gz").write_bytes(gzip.compress(text))  # under half a unit of text each
    many = ("\n".join(lines[:4]) + "\n").encode() * 1000  # ~1 MB of text that compresses well
    (d / "4.txt.gz").write_bytes(gzip.compress(many) + gzip.compress(b"tail\n"))  # then 5 bytes
    assert (d / "4.txt.gz").stat().st_size < 20_000 and len(many) > 4 * unit_bytes
    units = plan_units(CorpusConfig(source=str(d)), ShardConfig(unit_bytes=unit_bytes), str(tmp_path / "r"))
    alone = [u for u in units if u.source == str(d / "4.txt.gz")]
    assert len(alone) == 1 and not alone[0].members
    assert all(str(d / "4.txt.gz") not in dict(u.members) for u in units)
    assert any(len(u.members) > 1 for u in units)  # single-member files still pack by their ISIZE
    # Every line once, in order.
    got = [x for u in units for x in read_unit_text(u, "all")]
    assert len(got) == 8 * 100 + 4 * 1000 + 1


@pytest.mark.quick
def test_a_gzip_trailer_is_believed_only_where_it_can_describe_the_file():
    import os

    from tpu_ray.prepare.corpus import UNTRUSTED, _gzip_text_size

    one = gzip.compress(b"a few words\n" * 1000)
    assert _gzip_text_size(one[-4:], len(one)) == 12000
    noise = gzip.compress(os.urandom(50_000))  # incompressible: text a little under its stored size
    assert _gzip_text_size(noise[-4:], len(noise)) == 50_000
    two = gzip.compress(b"a few words\n" * 100_000) + gzip.compress(b"x\n")
    assert _gzip_text_size(two[-4:], len(two)) == UNTRUSTED  # several members
    assert _gzip_text_size((2**32 - 5).to_bytes(4, "little"), 1000) == UNTRUSTED  # more than deflate gives
    assert _gzip_text_size((7).to_bytes(4, "little"), 5_000_000) == UNTRUSTED  # may have wrapped past 4 GiB


@pytest.mark.quick
def test_a_zstd_files_first_frame_size_is_believed_only_where_it_can_be_the_files_text():
    import zstandard

    from tpu_ray.prepare.corpus import UNTRUSTED, _zstd_text_size

    one = zstandard.ZstdCompressor().compress(b"a few words\n" * 1000)
    assert _zstd_text_size(one[:18], len(one)) == 12000
    import os

    two = zstandard.ZstdCompressor().compress(b"x\n") + zstandard.ZstdCompressor().compress(os.urandom(50_000))
    assert _zstd_text_size(two[:18], len(two)) == UNTRUSTED  # `cat a.zst b.zst`: the first frame is not the file


# ---- 4. encodings: a byte-order mark is never text; UTF-16/32 refused in one line ---------------
@pytest.mark.quick
def test_a_utf8_byte_order_mark_is_never_text_in_any_format(tmp_path, lines):
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    bom = "\ufeff"
    body = lines[:50]
    (tmp_path / "a.txt").write_text(bom + "\n".join(body) + "\n")
    (tmp_path / "b.jsonl").write_text(bom + "".join(json.dumps({"text": t}) + "\n" for t in body))
    (tmp_path / "c.txt.gz").write_bytes(gzip.compress((bom + "\n".join(body) + "\n").encode()))
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress((bom + "".join(json.dumps({"text": t}) + "\n"
                                                                        for t in body)).encode()))
    with open(tmp_path / "e.csv", "w", newline="", encoding="utf-8-sig") as f:  # Excel's CSV
        w = csv.writer(f)
        w.writerow(["text", "id"])
        w.writerows([t, i] for i, t in enumerate(body))
    pq.write_table(pa.table({"text": [bom + t for t in body]}), tmp_path / "f.parquet")
    big = tmp_path / "big"
    big.mkdir()
    (big / "g.txt").write_text(bom + "\n".join(lines[:2000]) + "\n")  # byte ranges, the first at 0
    for name in ("a.txt", "b.jsonl", "c.txt.gz", "d.jsonl.gz", "e.csv", "f.parquet"):
        units = plan_units(CorpusConfig(source=str(tmp_path / name)), ShardConfig(), str(tmp_path / f"r-{name}"))
        assert [x for u in units for x in read_unit_text(u, "all")] == body, name
    units = plan_units(CorpusConfig(source=str(big / "g.txt")), ShardConfig(unit_bytes=16384), str(tmp_path / "rg"))
    got = [x for u in units for x in read_unit_text(u, "all")]
    assert len(units) > 4 and got == lines[:2000] and not any(bom in x for x in got)


@pytest.mark.parametrize("encoding,name", [("utf-16", "UTF-16 (little-endian)"), ("utf-32", "UTF-32 (little-endian)"),
                                           ("utf-16-be", "UTF-16 (big-endian)")])
@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".txt.gz", ".csv"])
@pytest.mark.quick
def test_a_utf16_or_utf32_file_is_refused_in_one_line_naming_file_and_encoding(encoding, name, suffix, tmp_path,
                                                                              lines):
    from tpu_ray.config import RunConfig
    from tpu_ray.prepare.preflight import preflight_corpus

    if suffix == ".jsonl":
        text = "".join(json.dumps({"text": t}) + "\n" for t in lines[:30])
    elif suffix == ".csv":
        text = "text\n" + "".join(f'"{t}"\n' for t in lines[:30])
    else:
        text = "\n".join(lines[:30]) + "\n"
    data = (("\ufeff" if encoding == "utf-16-be" else "") + text).encode(encoding)
    path = tmp_path / f"x{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    want = rf"x{suffix}: starts with a {name.replace('(', '.').replace(')', '.')} byte-order mark: only UTF-8"
    units = plan_units(CorpusConfig(source=str(path), encoding_errors="replace"), ShardConfig(), str(tmp_path / "r"))
    with pytest.raises(UserError, match=want) as info:
        for u in units:
            list(iter_chunks(u))
    assert "\n" not in str(info.value)
    if not suffix.endswith(".gz") and suffix != ".csv":  # the preflight sniffs uncompressed text files
        cfg = RunConfig.from_dict({"name": "t", "output_dir": str(tmp_path / "run"), "corpus": {"source": str(path)}})
        with pytest.raises(UserError, match=want):
            preflight_corpus(cfg.corpus)


# ---- done when: 1,000 files, 0.05% cut records, 10% without the field, bad_records=skip ----------
@pytest.mark.slow
def test_a_thousand_file_corpus_with_cut_and_fieldless_records_shards_exactly_the_good_ones(
        tmp_path, lines, tiny_tokenizer_dir, ray_local):
    """A thousand files with cut and field-less records, on real Ray: their shards hold exactly the tokens of the good
    records (compared with the shards of a plain .txt of them, cut at the same units), and the
    shards and the list are the same with one actor or two."""
    from tests.helpers import manifest_json, tiny_config
    from tpu_ray.prepare.shards import make_shards
    from tpu_ray.pipeline import shard_job

    d = tmp_path / "corpus"
    d.mkdir()
    n_files, per_file = 1000, 20  # 20,000 records: 10 cut (0.05%), 2,000 without the field (10%)
    good_by_file, k = [], 0
    for i in range(n_files):
        out, good = [], []
        for _ in range(per_file):
            t = lines[k % len(lines)] + f" ({k})"
            k += 1
            if k % 10 == 3:
                out.append(json.dumps({"title": t, "id": k}))
            elif k % 2000 == 7:
                out.append(json.dumps({"text": t, "id": k})[:25])
            else:
                out.append(json.dumps({"text": t, "id": k}))
                good.append(t)
        (d / f"part-{i:04d}.jsonl").write_text("\n".join(out) + "\n")
        good_by_file.append(good)
    base = {"corpus.bad_records": "skip", "corpus.validation_fraction": 0.0, "tokenizer.path": tiny_tokenizer_dir,
            "shard.unit_bytes": 65536}
    runs = {}
    for actors in (1, 2):
        cfg = tiny_config(tmp_path / f"run{actors}", d, **base)
        summary = make_shards(shard_job(cfg), actors=actors)
        runs[actors] = (cfg, summary)
    cfg, summary = runs[1]
    assert summary.bad_records == 10 and summary.skipped_by_kind == {"jsonl": 2000}
    assert "bad_records=10" in summary.line() and "skipped_records=2000 (jsonl: 2000)" in summary.line()
    manifest = manifest_json(cfg.shards_dir)
    assert manifest["bad_records"] == 10 and manifest["skipped_by_kind"] == {"jsonl": 2000}
    from tpu_ray.report import _shard_rows  # the report's Shards table

    rows = dict(_shard_rows(cfg.run_dir))
    assert rows["skipped records"] == "2,000 (jsonl: 2,000)" and rows["bad records"].startswith("10 (listed")
    listed = (Path(cfg.shards_dir) / BAD_FILE).read_text()
    assert len(listed.splitlines()) == 10
    assert listed == (Path(runs[2][0].shards_dir) / BAD_FILE).read_text()
    assert manifest["splits"] == manifest_json(runs[2][0].shards_dir)["splits"]  # every shard, byte for byte
    # Exactly the good records' tokens: the same units' files, rewritten as plain text of the good records.
    units = plan_units(cfg.corpus, cfg.shard, cfg.run_dir)
    plain = tmp_path / "plain"
    plain.mkdir()
    index = {str(d / f"part-{i:04d}.jsonl"): g for i, g in enumerate(good_by_file)}
    tokenizer, info = _tok(tiny_tokenizer_dir)
    got = {}
    for entry in manifest["splits"]["train"]["shards"]:
        got.setdefault(entry["unit"], []).append(entry["sha256"])
    want, tokens = {}, 0
    for u in units:
        texts = [t for p, _ in (u.members or ((u.source, 0),)) for t in index[p]]
        (plain / f"{u.index}.txt").write_text("\n".join(texts) + "\n")
        for pu in plan_units(CorpusConfig(source=str(plain / f"{u.index}.txt"), validation_fraction=0.0),
                             ShardConfig(unit_bytes=1 << 30, seq_len=SEQ), str(plain / f"r{u.index}")):
            result = process_unit(pu, tokenizer, info, SEQ, str(plain / f"out{u.index}"))
            want[u.index] = [s["sha256"] for s in result["shards"]]
            tokens += result["tokens"]
    assert len(units) > 10 and got == {i: w for i, w in want.items() if w}
    assert manifest["corpus_tokens"] == tokens


def _tok(path: str):
    from tokenizers import Tokenizer

    text = load_tokenizer_json(path)
    return Tokenizer.from_str(text), describe(text, path)


def test_too_many_bad_records_fail_the_pass_and_a_rerun_with_a_higher_bound_resumes_every_unit(
        tmp_path, lines, tiny_tokenizer_dir, ray_local):
    """On Ray: past corpus.max_bad_fraction the pass fails naming the count and the list, keeping
    every committed unit; raising the bound resumes them all (their counts are in the manifest) and
    writes the same list."""
    from tests.helpers import manifest_json, tiny_config
    from tpu_ray.prepare.shards import make_shards
    from tpu_ray.pipeline import shard_job

    path = tmp_path / "c.jsonl"
    _with_cut_records(path, lines[:760], 190)  # 4 of 760 records cut: 0.53%
    base = {"corpus.bad_records": "skip", "tokenizer.path": tiny_tokenizer_dir, "shard.unit_bytes": 32768}
    cfg = tiny_config(tmp_path / "run", path, **base)
    with pytest.raises(UserError, match=r"4 bad records of 760 \(0.526%\) exceed corpus.max_bad_fraction=0.001; "
                                        r"they are listed in .*shards/bad_records.jsonl"):
        make_shards(shard_job(cfg), actors=2)
    listed = (Path(cfg.shards_dir) / BAD_FILE).read_text()
    assert len(listed.splitlines()) == 4 and not manifest_json(cfg.shards_dir)["complete"]
    summary = make_shards(shard_job(cfg.override({"corpus.max_bad_fraction": 0.01})), actors=2)
    assert summary.skipped_units == summary.units > 1 and summary.bad_records == 4
    assert (Path(cfg.shards_dir) / BAD_FILE).read_text() == listed
    assert manifest_json(cfg.shards_dir)["complete"]
    from tpu_ray.report import _shard_rows  # the report's Shards table

    rows = dict(_shard_rows(cfg.run_dir))
    assert rows["bad records"] == "4 (listed in bad_records.jsonl)" and rows["skipped records"] == "0"
