"""The reader catalogue: what a record's text field may hold, for every reader.

The rule (tpu_ray/prepare/records.py): strings are text; null or missing is skipped and counted
(the manifest's `skipped_records`, printed by `tpu-ray shard`); a list of strings is an error
unless `corpus.text_lists=join`; anything else is one line naming the file, the record and the
type. The rows are keyed by `corpus.READERS`, so a reader added without a row fails here.
"""

from __future__ import annotations

import csv
import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tpu_ray.config import CorpusConfig, ShardConfig
from tpu_ray.errors import UserError
from tpu_ray.prepare.corpus import READERS, iter_chunks, plan_units
from tpu_ray.prepare.streams import Counts

GOOD = ["first text", None, "second text"]  # a null between two strings: skipped, counted


def _read(source: str, tmp: Path, **corpus) -> tuple[list[str], int]:
    units = plan_units(CorpusConfig(source=source, validation_fraction=0, **corpus), ShardConfig(), str(tmp))
    counts = Counts()
    lines = [line for u in units for c in iter_chunks(u, counts) for line in c.train + c.validation]
    return lines, counts.skipped


def _jsonl(tmp: Path, values: list, compressed: bool = False) -> str:
    rows = "".join(json.dumps({"text": v} if v is not _MISSING else {"other": 1}) + "\n" for v in values)
    path = tmp / ("r.jsonl.gz" if compressed else "r.jsonl")
    path.write_bytes(gzip.compress(rows.encode()) if compressed else rows.encode())
    return str(path)


_MISSING = object()


def _parquet(tmp: Path, values: list) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp / "r.parquet"
    pq.write_table(pa.table({"text": pa.array(values), "id": list(range(len(values)))}), path)
    return str(path)


def _dataset(tmp: Path, values: list) -> str:
    import datasets
    import pyarrow as pa

    path = tmp / "saved"
    datasets.Dataset(pa.table({"text": pa.array(values)})).save_to_disk(str(path))
    return str(path)


def _hf_builder(tmp: Path, values: list) -> tuple[str, dict]:
    """hf:json on a JSON-lines file (datasets' packaged builder types the column as Arrow)."""
    path = tmp / "b.jsonl"
    path.write_text("".join(json.dumps({"text": v}) + "\n" for v in values))
    return "hf:json", {"hf_config": str(path)}


def _csv(tmp: Path, rows: list[list[str]], sep: str, name: str) -> str:
    path = tmp / name
    with open(path, "w", newline="") as f:
        csv.writer(f, delimiter=sep).writerows(rows)
    return str(path)


# Each typed reader: a builder of a source from a list of field values (None = null).
TYPED: dict[str, Callable[[Path, list], tuple[str, dict]]] = {
    "jsonl": lambda t, v: (_jsonl(t, v), {}),
    "parquet": lambda t, v: (_parquet(t, v), {}),
    "hf_disk": lambda t, v: (_dataset(t, v), {}),
    "hf": _hf_builder,
}


@pytest.mark.quick
def test_every_reader_has_a_row():
    """The catalogue: typed readers below; txt, csv and tsv hold only strings (their own tests)."""
    assert set(READERS) == set(TYPED) | {"txt", "csv", "tsv"}


@pytest.mark.parametrize("fmt", sorted(TYPED))
@pytest.mark.quick
def test_strings_are_text_and_nulls_are_skipped_and_counted(fmt, tmp_path):
    source, extra = TYPED[fmt](tmp_path, GOOD)
    assert _read(source, tmp_path, **extra) == (["first text", "second text"], 1)


@pytest.mark.parametrize("fmt", sorted(TYPED))
@pytest.mark.parametrize("value,typename", [({"en": "Hello", "de": "Hallo"}, r"object \(dict\)|struct"),
                                            (7, "number|int64"), (True, "boolean|bool")])
@pytest.mark.quick
def test_other_types_are_one_line_naming_file_record_and_type(fmt, value, typename, tmp_path):
    source, extra = TYPED[fmt](tmp_path, [value, value])
    with pytest.raises(UserError) as info:
        _read(source, tmp_path, **extra)
    msg = str(info.value)
    assert "\n" not in msg and "field 'text'" in msg or "column 'text'" in msg, msg
    assert Path(source.replace("hf:json", extra.get("hf_config", ""))).name in msg, msg
    import re

    assert re.search(typename, msg) and "not text" in msg and "corpus.text_field" in msg, msg
    # the record: a line for JSON lines; a column type (every row) for typed tables
    assert ("line 1" in msg or "byte 0" in msg) if fmt == "jsonl" else "every row" in msg, msg


@pytest.mark.parametrize("fmt", sorted(TYPED))
@pytest.mark.quick
def test_a_list_of_strings_is_refused_or_joined_by_option(fmt, tmp_path):
    source, extra = TYPED[fmt](tmp_path, [["para one", "para two"], ["para three"]])
    with pytest.raises(UserError, match=r"lists? of strings.*set corpus.text_lists=join"):
        _read(source, tmp_path, **extra)
    assert _read(source, tmp_path, text_lists="join", **extra) == (["para one", "para two", "para three"], 0)


@pytest.mark.quick
def test_a_missing_field_is_skipped_and_counted_and_compressed_jsonl_obeys_the_same_rule(tmp_path):
    assert _read(_jsonl(tmp_path, ["a", _MISSING, None, "b"]), tmp_path) == (["a", "b"], 2)
    # Alone in a unit's validation tail, a record without the field is still skipped, not an error.
    units = plan_units(CorpusConfig(source=_jsonl(tmp_path, ["x" * 50] * 19 + [_MISSING]), validation_fraction=0.05),
                       ShardConfig(), str(tmp_path))
    counts = Counts()
    assert [c.validation for u in units for c in iter_chunks(u, counts)] == [[]] and counts.skipped == 1
    assert _read(_jsonl(tmp_path, ["a", _MISSING, None, "b"], compressed=True), tmp_path) == (["a", "b"], 2)
    with pytest.raises(UserError, match=r"r.jsonl.gz: line 2: field 'text' is a object \(dict\), not text"):
        _read(_jsonl(tmp_path, ["a", {"en": "x"}], compressed=True), tmp_path)


@pytest.mark.parametrize("fmt,sep", [("csv", ","), ("tsv", "\t")])
@pytest.mark.quick
def test_csv_cells_are_strings_and_short_rows_are_skipped_and_counted(fmt, sep, tmp_path):
    source = _csv(tmp_path, [["id", "text"], ["1", "first text"], ["2"], ["3", "{'en': 'x'}"]], sep, f"r.{fmt}")
    assert _read(source, tmp_path) == (["first text", "{'en': 'x'}"], 1)


@pytest.mark.quick
def test_plain_text_lines_are_text_whatever_they_spell(tmp_path):
    (tmp_path / "r.txt").write_text('{"text": 1}\nnull\nTrue\n')
    assert _read(str(tmp_path / "r.txt"), tmp_path) == (['{"text": 1}', "null", "True"], 0)


def test_the_manifest_counts_skipped_records_and_the_shard_line_prints_them(tmp_path, small_corpus,
                                                                            tiny_tokenizer_dir, ray_local):
    from tests.helpers import manifest_json, tiny_config
    from tpu_ray.prepare.shards import make_shards
    from tpu_ray.pipeline import shard_job

    lines = [s for s in small_corpus.read_text().splitlines() if s.strip()]
    path = tmp_path / "c.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i, line in enumerate(lines):
            f.write(json.dumps({"text": None if i % 10 == 0 else line}) + "\n")
    cfg = tiny_config(tmp_path / "run", path, **{"tokenizer.path": tiny_tokenizer_dir})
    summary = make_shards(shard_job(cfg), actors=1)
    skipped = len(range(0, len(lines), 10))
    assert manifest_json(cfg.shards_dir)["skipped_records"] == skipped == summary.skipped_records
    assert f"skipped_records={skipped}" in summary.line()
