"""In-memory corpora: a DataFrame, an Arrow table, a datasets Dataset / IterableDataset,
an iterable of strings and a Ray Dataset, given to `Pipeline(cfg, corpus=...)`, are written once into
RUN/corpus/ as parquet and shard to exactly the tokens of the same text given as a file.

Shards are made by the function every actor runs (tests/test_formats.py's `shards_of`), against the
same documents as plain .txt (`plain`). The Ray Dataset is written by Ray Data on the real local
cluster, with every driver-side collecting method of Dataset made to raise.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from tests.helpers import start_local_ray, tiny_config
from tests.test_formats import docs, plain, shards_of, tok  # noqa: F401 - fixtures used by name
from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError
from tpu_ray.pipeline import Pipeline, given_corpus
from tpu_ray.prepare import given as given_mod
from tpu_ray.prepare.given import mark_path, write_given

KINDS = ["pandas.DataFrame", "pyarrow.Table", "datasets.Dataset", "datasets.IterableDataset", "iterable",
         "ray.data.Dataset"]


def _as(kind: str, texts: list[str], column: str = "text"):
    import pandas as pd

    df = pd.DataFrame({column: texts, "id": range(len(texts))})
    if kind == "pandas.DataFrame":
        return df
    if kind == "pyarrow.Table":
        import pyarrow as pa

        return pa.Table.from_pandas(df, preserve_index=False)
    if kind.startswith("datasets."):
        import datasets

        ds = datasets.Dataset.from_pandas(df, preserve_index=False)
        return ds if kind == "datasets.Dataset" else ds.to_iterable_dataset()
    if kind == "iterable":
        return (t for t in texts)
    start_local_ray()
    import ray

    return ray.data.from_pandas(df)


def _written(tmp_path: Path, data, name: str = "run", **overrides):
    cfg, given = given_corpus(tiny_config(tmp_path / name, tmp_path / "unused", **overrides), data)
    return cfg, write_given(cfg.corpus, cfg.run_dir, cfg.ray.shared_filesystem, given)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_shards_to_the_tokens_of_the_same_text_as_a_file(kind, tmp_path, docs, tok):  # noqa: F811
    cfg, (record,) = _written(tmp_path, _as(kind, docs))
    assert cfg.corpus.source == str(tmp_path / "run" / "corpus" / "corpus" / "*.parquet")
    assert (record["kind"], record["rows"], record["text_rows"]) == (kind, len(docs), len(docs))
    assert record["columns"] == ([] if kind == "iterable" else ["text", "id"])
    assert shards_of(cfg.corpus.source, tmp_path, tok) == plain(tmp_path, [docs], tok)
    # Recorded in the run, the same identity whatever the kind the text came as.
    mark = json.loads(Path(mark_path(cfg.run_dir, "corpus")).read_text())
    assert mark == record
    assert record["content_sha256"] == _written(tmp_path, list(docs), name="ref")[1][0]["content_sha256"]
    assert not [p for p in (tmp_path / "run" / "corpus").iterdir() if p.name.startswith(".tmp")]


def test_a_ray_dataset_is_written_by_ray_workers_never_collected_on_the_driver(tmp_path, docs, monkeypatch):  # noqa: F811
    """Every Dataset method that brings rows to the driver raises here (the workers are other
    processes and are unaffected): the write must still succeed, by Ray Data's own execution.
    Several blocks, filtered on the cluster, land as several files."""
    start_local_ray()
    import ray

    ds = ray.data.from_items([{"text": d, "n": i} for i, d in enumerate(docs + ["", ""])], override_num_blocks=4)
    ds = ds.filter(lambda r: len(r["text"]) > 0)
    for method in ("to_pandas", "take_all", "take", "take_batch", "iter_rows", "iter_batches", "to_arrow_refs",
                   "to_pandas_refs", "show", "to_numpy_refs", "iter_torch_batches"):
        monkeypatch.setattr(ray.data.Dataset, method, _forbidden(method))
    cfg, (record,) = _written(tmp_path, ds)
    files = sorted((tmp_path / "run" / "corpus" / "corpus").glob("*.parquet"))
    assert record["files"] == len(files) >= 1
    assert record["text_rows"] == len(docs) and record["files"] > 1
    import pyarrow.parquet as pq

    texts = [t for f in files for t in pq.read_table(f, columns=["text"]).column("text").to_pylist()]
    assert sorted(texts) == sorted(docs)
    assert pq.read_schema(files[0]).names == ["text"]  # the text column only


def _forbidden(method: str):
    def raise_(*args, **kwargs):
        raise AssertionError(f"Dataset.{method} called on the driver")
    return raise_


@pytest.mark.quick
def test_an_iterable_ten_times_the_memory_budget_streams_within_it(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    budget = 256 * 1024
    monkeypatch.setattr(given_mod, "ROW_GROUP_BYTES", budget)
    seen: list[int] = []

    def lines():
        for i in range(10 * budget // 1000 + 10):
            if i % 50 == 0:
                seen.append(pa.total_allocated_bytes() + tracemalloc.get_traced_memory()[0])
            yield f"line {i:07d} " + "x" * 987

    _written(tmp_path, ["warm-up: every import done before measuring"], name="warm")
    tracemalloc.start()
    try:
        base = pa.total_allocated_bytes() + tracemalloc.get_traced_memory()[0]
        cfg, (record,) = _written(tmp_path, lines())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert record["text_bytes"] >= 10 * budget
    assert max(seen) - base < 4 * budget, (max(seen) - base, budget)  # a row group, its copy, the writer
    assert peak < 3 * budget, peak  # Python objects held at once (the strings of one row group at most)
    pf = pq.ParquetFile(next((tmp_path / "run" / "corpus" / "corpus").glob("*.parquet")))
    assert pf.metadata.num_row_groups >= 9


@pytest.mark.parametrize("kind", ["pandas.DataFrame", "pyarrow.Table", "datasets.Dataset", "ray.data.Dataset"])
def test_no_text_column_is_one_line_naming_the_columns_found(kind, tmp_path, docs):  # noqa: F811
    with pytest.raises(UserError) as err:
        _written(tmp_path, _as(kind, docs[:20], column="body"))
    line = str(err.value)
    assert "\n" not in line and "no column 'text'" in line and "body" in line and "id" in line, line
    assert not list((tmp_path / "run").rglob("*.parquet"))  # nothing half-written


@pytest.mark.quick
def test_a_column_of_numbers_an_empty_frame_and_non_strings_are_one_line(tmp_path):
    import pandas as pd

    cases = [(pd.DataFrame({"text": [1, 2, 3], "id": [1, 2, 3]}), "has type int64, not text"),
             (pd.DataFrame({"text": pd.Series([], dtype=object), "id": []}), "no text rows (columns: text, id)"),
             (iter(["a", 3]), "item 1 is int, not a string"),
             (42, "corpus=int: not a corpus")]
    for i, (data, needle) in enumerate(cases):
        with pytest.raises(UserError) as err:
            Pipeline(tiny_config(tmp_path / f"r{i}", tmp_path / "unused"), corpus=data).tokenizer()
        assert "\n" not in str(err.value) and needle in str(err.value), str(err.value)
        assert not list((tmp_path / f"r{i}").rglob("*.parquet"))


def test_a_ray_dataset_of_numbers_is_one_line_from_the_worker(tmp_path):
    start_local_ray()
    import ray

    with pytest.raises(UserError) as err:
        _written(tmp_path, ray.data.from_items([{"text": i, "id": i} for i in range(5)]))
    assert "\n" not in str(err.value) and "column 'text' has type int64, not text (string) (columns: text, id); set" in str(err.value)


@pytest.mark.quick
def test_named_sources_take_data_and_paths_and_a_resume_with_other_data_is_refused(tmp_path, docs, small_corpus):  # noqa: F811
    import pandas as pd

    cfg = tiny_config(tmp_path / "run", tmp_path / "unused").override(
        {"corpus.source": "builtin:python-docs",
         "corpus.sources": {"domain": {"source": "x", "weight": 0.7}, "general": {"source": "y", "weight": 0.3}}})
    df = pd.DataFrame({"text": docs})
    p = Pipeline(cfg, corpus={"domain": df, "general": str(small_corpus)})
    assert p.cfg.corpus.sources["general"].source == str(small_corpus)
    p.tokenizer()
    assert json.loads(Path(mark_path(cfg.run_dir, "domain")).read_text())["rows"] == len(docs)
    # The same data again (a resume): accepted, nothing rewritten; other data: one line.
    before = sorted(p.name for p in (tmp_path / "run" / "corpus" / "domain").iterdir())
    Pipeline(cfg, corpus={"domain": df.copy(), "general": str(small_corpus)}).tokenizer()
    assert sorted(p.name for p in (tmp_path / "run" / "corpus" / "domain").iterdir()) == before
    with pytest.raises(UserError, match=r"^corpus.sources.domain \(pandas.DataFrame\): not the data .* was made "
                                        r"with .*use a new output_dir$"):
        Pipeline(cfg, corpus={"domain": df.iloc[:-1], "general": str(small_corpus)}).tokenizer()
    with pytest.raises(UserError, match="no such source in corpus.sources"):
        Pipeline(cfg, corpus={"other": df})
    with pytest.raises(UserError, match="pass a dict"):
        Pipeline(cfg, corpus=df)


@pytest.mark.quick
def test_a_dict_without_sources_in_the_config_names_the_sources(tmp_path, docs):  # noqa: F811
    import pandas as pd

    cfg, given = given_corpus(tiny_config(tmp_path / "run", tmp_path / "unused"),
                              {"a": pd.DataFrame({"text": docs[:10]}), "b": list(docs[10:20])})
    assert list(cfg.corpus.sources) == ["a", "b"] and [g.kind for g in given] == ["pandas.DataFrame", "iterable"]
    assert cfg.corpus.sources["b"].source.endswith("corpus/b/*.parquet")


# A node-local run directory for an in-memory corpus on a 2-node cluster is refused: on the 2-node
# cluster tests/test_shards.py's TestOnTwoNodes already starts (one cluster, not one per test).


@pytest.mark.parametrize("kind", ["pandas.DataFrame", "ray.data.Dataset"])
def test_a_gs_run_directory_gets_the_corpus_and_shards_like_a_file(kind, gcs_emulator, tmp_path, docs, tok):  # noqa: F811
    """On gs:// the corpus lands under RUN/corpus/ in the bucket (Ray Data writing through the
    same filesystem as `storage`), with nothing left under a temporary name."""
    from tpu_ray import storage

    bucket = gcs_emulator.make_bucket()
    cfg, given = given_corpus(tiny_config(tmp_path / "unused-run", tmp_path / "unused", output_dir=f"{bucket}/run"),
                              _as(kind, docs))
    (record,) = write_given(cfg.corpus, cfg.run_dir, cfg.ray.shared_filesystem, given)
    assert cfg.corpus.source == f"{bucket}/run/corpus/corpus/*.parquet" and record["text_rows"] == len(docs)
    assert storage.exists(f"{bucket}/run/corpus/corpus.given.json")
    assert not [p for p in storage.listdir(f"{bucket}/run/corpus") if ".tmp-" in p]
    from tpu_ray.prepare.corpus import plan_units, read_unit_text

    texts = sorted(t for u in plan_units(cfg.corpus, cfg.shard, str(tmp_path)) for t in read_unit_text(u, "all"))
    assert texts == sorted(line for d in docs for line in d.split("\n"))


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_the_pipeline_uses_the_ray_cluster_the_process_already_runs(tmp_path, docs):  # noqa: F811
    """Analytics code that built a Ray Dataset called ray.init: the pipeline writes with that
    cluster (no second one started, none shut down) and its stages read what was written."""
    start_local_ray()
    import ray

    address = ray.get_runtime_context().gcs_address
    cfg = tiny_config(tmp_path / "run", tmp_path / "unused")
    assert cfg.ray.address is None
    p = Pipeline(cfg, corpus=ray.data.from_items([{"text": d} for d in docs]))
    p.tokenizer()
    assert ray.is_initialized() and ray.get_runtime_context().gcs_address == address
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").exists()
    assert json.loads((tmp_path / "run" / "corpus" / "corpus.given.json").read_text())["kind"] == "ray.data.Dataset"


@pytest.mark.quick
def test_an_iterable_dataset_whose_first_texts_are_null_is_written_with_them_skipped(tmp_path):
    """Before, an in-memory datasets.IterableDataset whose first 1,024 texts are null ended in a
    raw ArrowNotImplementedError (the first batch's column was typed null, the next string)."""
    import datasets

    from tpu_ray.pipeline import given_corpus
    from tpu_ray.prepare.given import write_given

    rows = [{"text": None}] * 1500 + [{"text": f"line {i} of text"} for i in range(100)]
    ds = datasets.IterableDataset.from_generator(lambda: iter(rows))
    cfg, given = given_corpus(RunConfig.from_dict({"output_dir": str(tmp_path / "run")}), ds)
    (record,) = write_given(cfg.corpus, cfg.run_dir, cfg.ray.shared_filesystem, given)
    assert record["rows"] == 1600 and record["text_rows"] == 100, record
