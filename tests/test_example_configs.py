"""The example configs in jobs/configs/ work from a user's clone: every source they read is reachable
from it, and the replay example plans every source offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpu_ray.config import RunConfig

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parents[1] / "jobs" / "configs").glob("*.yaml")))
def test_every_example_config_reads_data_a_users_clone_reaches(name):
    """continue_with_replay.yaml once pointed at ../shared/data/..., which exists beside this
    repository's test checkout, not beside a user's clone: every source is the built-in corpus, a
    Hub dataset, a bucket, or a path inside the repository."""
    repo = Path(__file__).parents[1]
    cfg = RunConfig.from_yaml(str(repo / "jobs" / "configs" / name))
    named = cfg.corpus.named_sources().values() if cfg.corpus.sources else [cfg.corpus]
    for src in named:
        for where in (src.source, src.validation_source):
            if where and not where.startswith(("builtin:", "hf:", "hf://", "gs://")):
                assert not where.startswith("..") and list(repo.glob(where)), (name, where)


def test_the_replay_example_plans_every_source_offline(monkeypatch, tmp_path):
    """continue_with_replay.yaml read WikiText-2 from the Hub: offline it failed (after 30 s of
    retries without HF_HUB_OFFLINE). Shipped, every source is planned with no network (the suite
    runs with HF_HUB_OFFLINE=1), from the repository root as the example says."""
    from tests.helpers import REPO
    from tpu_ray.config import BUILTIN_CORPUS
    from tpu_ray.prepare.corpus import plan_units
    from tpu_ray.prepare.preflight import preflight_corpus

    monkeypatch.chdir(REPO)
    cfg = RunConfig.from_yaml("jobs/configs/continue_with_replay.yaml").override({"output_dir": str(tmp_path / "run")})
    assert preflight_corpus(cfg.corpus)
    for name, src in cfg.corpus.named_sources().items():
        if src.source != BUILTIN_CORPUS:
            assert plan_units(src, cfg.shard, cfg.run_dir), name
    assert cfg.corpus.sources["domain_test"].weight == 0  # still scores held-out text beside the replay
