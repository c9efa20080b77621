"""One reader per format: the planner knows readers, not formats.

A format is one class registered in tpu_ray/prepare/readers/; here a toy format (".upper" files,
one record per line, read upper-cased) is registered the way a new module would, and the real
planner lists, plans, reads and describes it with no other change.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tpu_ray.config import CorpusConfig, ShardConfig
from tpu_ray.prepare import readers
from tpu_ray.prepare.actor_pool import describe_unit
from tpu_ray.prepare.corpus import READERS, plan_units, read_unit_text
from tpu_ray.prepare.readers import detect
from tpu_ray.prepare.readers.base import CorpusFile, PlanContext, Reader, WorkUnit
from tpu_ray.prepare.streams import Chunk, Counts, lines_of

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def test_every_format_is_a_registered_reader_that_describes_itself():
    found = readers.formats()
    assert set(found) == {"txt", "jsonl", "csv", "tsv", "parquet", "hf_disk", "hf"}
    assert READERS == {fmt: r.describe() for fmt, r in found.items()}
    assert all(isinstance(r, Reader) and r.describe() for r in found.values())
    assert readers.source_reader("builtin:python-docs") is not None and readers.source_reader("hf:json") is not None
    assert readers.source_reader("/data/x.txt") is None and readers.source_reader("hf://datasets/x/y.txt") is None


@pytest.fixture
def upper_format():
    class UpperReader(Reader):
        fmt = "upper"
        description = "a whole .upper file, its lines upper-cased"
        suffixes = (".upper",)

        def plan(self, file: CorpusFile, ctx: PlanContext) -> list[WorkUnit]:
            return [WorkUnit(0, file.path, self.fmt, 0, file.size, file.size, **ctx.common)]  # type: ignore[arg-type]

        def chunks(self, unit: WorkUnit, counts: Counts) -> Iterator[Chunk]:
            with open(unit.source) as f:
                yield Chunk(lines_of([f.read().upper()]), [])

        def where(self, unit: WorkUnit) -> str:
            return f"{unit.source} (all of it)"

    readers._load()
    readers.register(UpperReader)
    try:
        yield
    finally:
        del readers._FORMATS["upper"]


def test_a_new_format_is_one_registered_class(tmp_path, upper_format):
    (tmp_path / "a.upper").write_text("shout this\nand this\n")
    (tmp_path / "b.txt").write_text("plain text\n")
    assert detect(str(tmp_path / "a.upper")) == ("upper", None)
    units = plan_units(CorpusConfig(source=str(tmp_path), validation_fraction=0.0), ShardConfig(), str(tmp_path))
    assert [u.fmt for u in units] == ["upper", "txt"]
    assert read_unit_text(units[0], "all") == ["SHOUT THIS", "AND THIS"]
    assert read_unit_text(units[1], "all") == ["plain text"]
    assert describe_unit(units[0]) == f"{tmp_path / 'a.upper'} (all of it)"
