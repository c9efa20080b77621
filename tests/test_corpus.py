"""Corpus sources: .txt, .jsonl, .parquet, globs and a `datasets` builder read the same lines."""

from __future__ import annotations

import json

import pytest

from tpu_ray.config import CorpusConfig, ShardConfig
from tpu_ray.prepare.corpus import plan_units, read_unit_text
from tpu_ray.errors import UserError


@pytest.fixture(scope="module")
def lines(small_corpus) -> list[str]:
    return [s.strip() for s in small_corpus.read_text().splitlines() if s.strip()][:400]


def _read(source: str, tmp_path, **corpus) -> list[str]:
    units = plan_units(CorpusConfig(source=source, validation_fraction=0.0, **corpus),
                       ShardConfig(unit_bytes=4096, unit_rows=50), str(tmp_path))
    return [line for u in units for line in read_unit_text(u, "all")]


def test_txt_jsonl_parquet_glob_and_datasets_give_the_same_lines(tmp_path, lines):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("\n".join(lines[:200]) + "\n")
    (tmp_path / "b.txt").write_text("\n\n".join(lines[200:]) + "\n")  # blank lines are skipped
    with open(tmp_path / "c.jsonl", "w") as f:
        for line in lines:
            f.write(json.dumps({"text": line, "id": 1}) + "\n")
    pq.write_table(pa.table({"body": lines}), tmp_path / "d.parquet")

    assert _read(str(tmp_path / "*.txt"), tmp_path) == lines
    assert _read(str(tmp_path / "c.jsonl"), tmp_path) == lines
    assert _read(str(tmp_path / "d.parquet"), tmp_path, text_field="body") == lines
    # A Hugging Face `datasets` builder (the packaged "text" one reads local files, no download).
    assert _read("hf:text", tmp_path, hf_config=str(tmp_path / "a.txt")) == lines[:200]


def test_a_jsonl_record_without_the_text_field_is_named(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n')
    with pytest.raises(UserError, match=r"x.jsonl: record at 17 has no field 'text'; set corpus.text_field"):
        _read(str(tmp_path / "x.jsonl"), tmp_path)
