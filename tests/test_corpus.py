"""Corpus sources: .txt, .jsonl, .parquet, globs and a `datasets` builder read the same lines."""

from __future__ import annotations

import json

import pytest

from tpu_ray.config import CorpusConfig, RunConfig, ShardConfig
from tpu_ray.prepare.corpus import iter_train_text, plan_units, read_unit_text
from tpu_ray.errors import UserError

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


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


def test_a_jsonl_file_where_no_record_has_the_text_field_is_named(tmp_path):
    """A typo'd corpus.text_field (no record has it) is an error naming the fields that exist; a record
    that lacks it among records that have it is skipped and counted (tests/test_text_field_rule.py has
    the rule for every reader).
    The corpus is refused, not a unit: the tokenizer's reading of it says so once."""
    (tmp_path / "x.jsonl").write_text('{"body": "no text", "id": 1}\n{"body": "none here"}\n')
    units = plan_units(CorpusConfig(source=str(tmp_path / "x.jsonl"), validation_fraction=0.0),
                       ShardConfig(unit_bytes=4096, unit_rows=50), str(tmp_path))
    with pytest.raises(UserError, match=r"x.jsonl: byte 0: record has no field 'text' \(fields: body, id\); "
                                        r"set corpus.text_field"):
        iter_train_text(units, 1 << 20)
    (tmp_path / "y.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n')
    assert _read(str(tmp_path / "y.jsonl"), tmp_path) == ["fine"]


def test_long_lines_are_split_at_whitespace_within_the_bound():
    """A line over corpus.max_line_bytes becomes pieces of at most that many bytes,
    cut after whitespace (every word whole, in order), or at the bound but never inside a character."""
    from tpu_ray.prepare.lines import split_long_lines

    words = [f"wörd{i}" for i in range(5000)]
    out, cut = split_long_lines(["short", " ".join(words)], 1024)
    assert cut == 1 and out[0] == "short" and len(out) > 30
    assert all(len(p.encode()) <= 1024 for p in out)
    assert " ".join(out[1:]).split() == words
    out, cut = split_long_lines(["é" * 3000], 1024)
    assert cut == 1 and "".join(out) == "é" * 3000 and all(len(p.encode()) <= 1024 for p in out)


def test_a_line_without_newline_is_cut_into_bounded_units(tmp_path):
    """Unit boundaries fall after whitespace when no line ends within max_line_bytes: a huge line no
    longer makes one huge unit (one actor's whole memory); every word is still read exactly once."""
    words = [f"w{i % 977}x{i}" for i in range(300_000)]
    path = tmp_path / "one-line.txt"
    path.write_text(" ".join(words))  # ~3 MB, no newline at all
    corpus = CorpusConfig(source=str(path), validation_fraction=0.1, max_line_bytes=64 * 1024)
    units = plan_units(corpus, ShardConfig(unit_bytes=1 << 20), str(tmp_path))
    assert len(units) >= 3
    assert all(u.end - u.start <= (1 << 20) + 64 * 1024 for u in units)
    assert [w for u in units for line in read_unit_text(u, "all") for w in line.split()] == words


def test_directories_in_a_corpus_directory_or_glob_are_not_read(tmp_path):
    """A subdirectory (even one named like a text file) is skipped, never opened as a file."""
    from pathlib import Path

    from tpu_ray.prepare.corpus import resolve_files

    root = tmp_path / "c"
    (root / "sub.txt").mkdir(parents=True)
    (root / "deeper").mkdir()
    (root / "a.txt").write_text("hello\n")
    (root / "deeper" / "b.txt").write_text("world\n")
    assert [Path(f).name for f, _ in resolve_files(str(root))] == ["a.txt", "b.txt"]
    assert [Path(f).name for f, _ in resolve_files(str(root / "*"))] == ["a.txt"]


def test_the_tokenizer_sample_covers_every_file_deterministically_by_seed(tmp_path, lines):
    """With a corpus larger than tokenizer.train_bytes, the sample is drawn across all
    files (by seed), not the first files in order; a corpus that fits is read whole, in order."""
    from tpu_ray.prepare.corpus import iter_train_text

    for i in range(10):
        (tmp_path / f"src-{i}.txt").write_text("".join(f"file{i} {line}\n" for line in lines[:100]))
    units = plan_units(CorpusConfig(source=str(tmp_path / "*.txt"), validation_fraction=0.0),
                       ShardConfig(unit_bytes=4096), str(tmp_path / "run"))
    assert len(units) >= 40

    def files_in(seed: int, budget: int) -> list[str]:
        batches = iter_train_text(units, budget, seed=seed)
        return [line.split()[0] for batch in batches for line in batch]

    budget = sum(u.end - u.start for u in units) // 4
    sample = files_in(0, budget)
    assert len(set(sample)) >= 6  # a quarter of the corpus from most files, not files 0-2
    assert files_in(0, budget) == sample and files_in(1, budget) != sample
    whole = files_in(0, 10 * budget)
    assert whole == sorted(whole, key=lambda f: int(f[4:])) and len(set(whole)) == 10


def test_a_json_array_file_is_refused_naming_its_shape(tmp_path):
    """Before, a .json file holding one JSON array got "not a JSON line" for each of its lines
    and the advice to skip them all."""
    import json

    from tpu_ray.config import CorpusConfig, ShardConfig
    from tpu_ray.prepare.corpus import plan_units, read_unit_text
    from tpu_ray.prepare.preflight import preflight_corpus

    path = tmp_path / "corpus.json"
    path.write_text(json.dumps([{"text": f"record {i}"} for i in range(50)], indent=2))
    cfg = RunConfig.from_dict({"corpus": {"source": str(path)}, "output_dir": str(tmp_path / "run")})
    for check in (lambda: preflight_corpus(cfg.corpus),
                  lambda: [read_unit_text(u, "all") for u in plan_units(CorpusConfig(source=str(path)),
                                                                         ShardConfig(), str(tmp_path / "r"))]):
        with pytest.raises(UserError) as err:
            check()
        message = str(err.value)
        assert "one JSON array" in message and "jq -c" in message and "not a JSON line (" not in message, message
