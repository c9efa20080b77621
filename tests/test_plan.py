"""The run's plan (train/plan.py): spans, their data starts, rates and stages, resolved
from the config alone, without TensorFlow."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tpu_ray.config import RunConfig
from tpu_ray.train.plan import CONTINUE, FIRST, UNREAD, plan

pytestmark = pytest.mark.quick


def test_a_run_without_phases_is_a_plan_of_one_span():
    cfg = RunConfig().override({"train.steps": 100, "train.warmup_steps": 10, "train.learning_rate": 1e-3,
                                "shard.seq_len": 128, "train.batch_size": 32})
    p = plan(cfg.train, cfg.corpus, cfg.paths)
    assert len(p.spans) == 1 and not p.phased
    (sp,) = p.spans
    assert (sp.span.start, sp.span.end, sp.seq_len, sp.batch_size) == (0, 100, 128, 32)
    assert sp.shards_dir == cfg.shards_dir and sp.data.how == FIRST and sp.stages == (0,)
    assert sp.learning_rate[0] == 0.0 and sp.learning_rate[1] < 1e-3
    assert "steps 1-100 at seq_len 128" in p.rows()[1]


def test_phases_continue_at_one_length_and_start_unread_text_at_another():
    cfg = RunConfig().override({"train.steps": 1000, "shard.seq_len": 512, "train.batch_size": 64, "train.phases": [
        {"steps": 100, "seq_len": 128, "batch_size": 32}, {"steps": 800, "seq_len": 128},
        {"steps": 100, "seq_len": 512, "mask_prob": 0.3}]})
    p = plan(cfg.train, cfg.corpus, cfg.paths)
    assert p.phased and [sp.data.how for sp in p.spans] == [FIRST, CONTINUE, UNREAD]
    assert [sp.data.samples_before for sp in p.spans] == [0, 3200, 3200 + 800 * 64]
    assert p.spans[0].shards_dir.endswith("seq-128") and p.spans[2].shards_dir == cfg.shards_dir
    assert p.spans[2].mask_rate == (0.3, 0.3)
    assert [sp.span.index for sp in p.remaining(950)] == [2]


def test_a_mixture_plan_names_the_weight_stages_each_span_runs_under():
    cfg = RunConfig().override({"train.steps": 100, "train.phases": [{"steps": 50, "seq_len": 32},
                                                                      {"steps": 50, "seq_len": 64}],
                                "shard.seq_len": 64, "corpus.sources": {"a": {"source": "a.txt"},
                                                                        "b": {"source": "b.txt"}},
                                "corpus.weight_schedule": [{"step": 70, "weights": {"a": 0.1}}]})
    assert [sp.stages for sp in plan(cfg.train, cfg.corpus, cfg.paths).spans] == [(0,), (0, 70)]


def test_a_branch_plan_starts_at_the_stable_runs_step_with_its_rate():
    cfg = RunConfig().override({"train.steps": 120, "train.schedule": "wsd", "train.warmup_steps": 10,
                                "train.decay_steps": 20, "train.learning_rate": 1e-3})
    p = plan(cfg.train, cfg.corpus, cfg.paths, start=100)
    assert p.start == 100 and p.spans[0].learning_rate[0] == pytest.approx(1e-3)
    assert p.rows()[0].startswith("120 steps from step 100 (branch)")


def test_the_plan_needs_no_tensorflow():
    code = ("import sys; from tpu_ray.config import RunConfig; from tpu_ray.train.plan import plan; "
            "c = RunConfig(); print(plan(c.train, c.corpus, c.paths).rows()); assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)

