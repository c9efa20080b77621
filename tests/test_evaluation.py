"""One evaluation path (train/evaluation.py): the loop's evaluation and `tpu-ray eval`
record the same Evaluation, each source's record then the pooled one, under their own kinds."""

from __future__ import annotations

import json
import math

import pytest

from tpu_ray.metrics_stream import MetricsWriter, read_records
from tpu_ray.train.evaluation import Evaluation, figures

pytestmark = pytest.mark.quick


def test_figures_from_the_summed_counts():
    got = figures([2 * math.log(2) * 10, 3, 10, 20, 1, 0], "set", 0.15)
    assert got["eval_loss"] == pytest.approx(2 * math.log(2)) and got["eval_accuracy"] == 0.3
    assert got["bits_per_byte"] == pytest.approx(1.0) and got["eval_unscored_targets"] == 1
    assert figures([1.0, 0, 4, 9, 0, 2], "set", 0.15)["bits_per_byte"] is None  # bytes unknown: no figure


def test_the_loop_and_a_rerun_write_the_same_records_under_their_kinds(tmp_path):
    result = Evaluation(7, {"eval_loss": 1.5, "eval_set": "ab"},
                        {"a": {"eval_loss": 1.0, "eval_samples": 4}, "b": {"eval_loss": 2.0, "eval_samples": 4}})
    metrics = MetricsWriter(str(tmp_path))
    pooled, sources = result.record(metrics)
    rerun, _ = result.record(metrics, "eval_rerun", "eval_rerun", checkpoint="ckpt-7")
    metrics.close()
    assert [r["source"] for r in sources] == ["a", "b"] and pooled["kind"] == "eval" and pooled["step"] == 7
    kinds = [(r["kind"], r.get("source")) for r in read_records(str(tmp_path))]
    assert kinds == [("eval_source", "a"), ("eval_source", "b"), ("eval", None),
                     ("eval_rerun", "a"), ("eval_rerun", "b"), ("eval_rerun", None)]
    assert rerun["checkpoint"] == "ckpt-7" and rerun["eval_loss"] == pooled["eval_loss"]
    assert json.loads(json.dumps(result.as_dict()))["sources"]["b"]["eval_loss"] == 2.0
