"""A JSON-lines record is never cut in two.

Before, a unit boundary (or the validation split point) that found no newline within
corpus.max_line_bytes of it moved to the next space, inside the record: a valid record became two
invalid lines, the run failed calling the file bad, and under bad_records=skip one valid record was
listed as two bad ones. Now a JSON-lines boundary moves to the next record boundary, and a record
longer than the limit is one named error, or one skipped record under bad_records=skip.
Real files, the real planner and the real sharding function; no Ray, no TensorFlow.
"""

from __future__ import annotations

import json

import pytest

from tpu_ray.config import CorpusConfig, ShardConfig, TokenizerConfig
from tpu_ray.errors import UserError
from tpu_ray.prepare.bad_records import UNIT_DIR
from tpu_ray.prepare.corpus import plan_units, read_unit_text
from tpu_ray.prepare.shards import process_unit, text_tokenizer
from tpu_ray.prepare.tokenizer import describe, train_tokenizer

LIMIT = 1024
LONG = " ".join(f"word{i}" for i in range(400))  # ~3.5 KB of text, spaces all through it


def _corpus(tmp_path) -> tuple[str, list[str]]:
    texts = [f"record {i} says something short." for i in range(60)]
    texts[30] = LONG
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path), texts


def _units(tmp_path, path: str, frac: float = 0.0, **corpus):
    # unit_bytes puts unit boundaries (and with frac, split points) inside the long record
    return plan_units(CorpusConfig(source=path, validation_fraction=frac, max_line_bytes=LIMIT, **corpus),
                      ShardConfig(unit_bytes=1024, seq_len=16), str(tmp_path / "run"))


@pytest.mark.quick
@pytest.mark.parametrize("frac", [0.0, 0.5])
def test_no_unit_boundary_or_split_point_falls_inside_a_record(tmp_path, frac):
    path, texts = _corpus(tmp_path)
    units = _units(tmp_path, path, frac)
    assert len(units) > 2
    read = [line for u in units for line in read_unit_text(u, "all")]
    assert read == texts  # every record whole, once, in order (the long one included)


def _shard(tmp_path, units) -> list[dict]:
    tok = train_tokenizer([["record says something short word"] * 10], TokenizerConfig(kind="wordpiece",
                                                                                       vocab_size=100))
    info = describe(tok.to_str(), "test")
    return [process_unit(u, text_tokenizer(tok.to_str()), info, 16, str(tmp_path / "shards"), LIMIT)
            for u in units]


@pytest.mark.quick
def test_a_record_over_the_limit_is_one_named_error(tmp_path):
    path, _ = _corpus(tmp_path)
    with pytest.raises(UserError) as err:
        _shard(tmp_path, _units(tmp_path, path))
    message = str(err.value)
    assert "corpus.max_line_bytes=1024" in message and "c.jsonl" in message and "not a JSON line" not in message
    assert len(message.splitlines()) == 1


@pytest.mark.quick
def test_under_bad_records_skip_it_is_one_skipped_record(tmp_path):
    path, texts = _corpus(tmp_path)
    results = _shard(tmp_path, _units(tmp_path, path, bad_records="skip"))
    assert sum(r["bad_records"] for r in results) == 1, results
    listed = [json.loads(line) for f in (tmp_path / "shards" / UNIT_DIR).iterdir() for line in f.read_text().splitlines()]
    assert len(listed) == 1 and "max_line_bytes" in listed[0]["reason"], listed
    assert sum(r["records"] for r in results) == len(texts), results
