"""Named sources mixed by weight (replay), evaluation per source, bad mixtures refused.

The draw is tested on real TFRecords whose samples carry their source's token, the whole path on a
real three-source run (Ray actors, a tiny model): each source evaluated at every evaluation,
80/20 drawn and nothing from the evaluation-only source."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError
from tpu_ray.prepare.tfrecord import examples_file
from tpu_ray.train.mixture import MixtureTracker, Mixture, block_size, counts_before, mixture_for

SEQ = 8


def _shards(tmp_path: Path, sources: dict[str, int]) -> dict[str, list[tuple[str, int]]]:
    """Per source, three files of 40 samples whose every token is the source's marker (10, 11, ...)."""
    out = {}
    for k, name in enumerate(sources):
        files = []
        for i in range(3):
            path = tmp_path / f"train-{k:02d}{i:03d}-40.tfrecord"
            path.write_bytes(examples_file(np.full((40, SEQ), 10 + k, dtype=np.int32)))
            files.append((str(path), 40))
        out[name] = files
    return out


def _mixture(weights: dict[str, float], stages=(), temperature=None) -> Mixture:
    cfg = RunConfig.from_dict({"corpus": {"sources": {n: {"source": f"/x/{n}.txt", "weight": w}
                                                      for n, w in weights.items()},
                                          "weight_schedule": list(stages) or None,
                                          "weight_temperature": temperature}})
    return mixture_for(cfg.corpus, {n: 120 for n in cfg.corpus.trained()}, seed=5)


def _drawn(tracker: MixtureTracker, start_step: int, steps: int, batch: int) -> list[int]:
    ctx = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)
    records, _ = tracker.records(ctx, start_step)
    spec = {"input_ids": tf.io.FixedLenFeature([SEQ], tf.int64)}
    ids = records.take(steps * batch).map(lambda s: tf.io.parse_single_example(s, spec)["input_ids"][0])
    return [int(x) - 10 for x in ids.as_numpy_iterator()]


def test_batches_draw_each_source_by_weight_and_the_count_is_exact(tmp_path):
    files = _shards(tmp_path, {"domain": 1, "general": 1})
    mixture = _mixture({"domain": 0.8, "general": 0.2, "general_test": 0.0})
    assert mixture.names == ("domain", "general")  # the evaluation-only source is never drawn
    tracker = MixtureTracker([f for fs in files.values() for f in fs], 16, 64, mixture, files)
    drawn = _drawn(tracker, 0, 256, 16)
    counts = np.bincount(drawn, minlength=2)
    assert abs(counts[0] / len(drawn) - 0.8) < 0.01, counts
    # What the metrics and summary.json report is exactly what the batches held, at every step.
    assert tracker.source_samples(256) == {"domain": int(counts[0]), "general": int(counts[1])}
    for step in (1, 7, 64, 100):
        assert list(counts_before(mixture, 16, step * 16)) == list(np.bincount(drawn[: step * 16], minlength=2))


def test_a_resumed_stream_continues_every_source_where_it_was(tmp_path):
    files = _shards(tmp_path, {"a": 1, "b": 1, "c": 1})
    mixture = _mixture({"a": 0.5, "b": 0.3, "c": 0.2})
    tracker = MixtureTracker([f for fs in files.values() for f in fs], 8, 16, mixture, files)
    whole = _drawn(tracker, 0, 200, 8)
    assert _drawn(tracker, 137, 63, 8) == whole[137 * 8:]  # same sources, in the same order
    # Each source's own records continue too: the samples' positions come from the closed form.
    ctx = tf.distribute.InputContext()
    first, _ = tracker.records(ctx, 0)
    later, _ = tracker.records(ctx, 137)
    a = list(first.take(200 * 8).as_numpy_iterator())
    assert list(later.take(63 * 8).as_numpy_iterator()) == a[137 * 8:]


def test_a_weight_schedule_changes_the_draw_at_its_step(tmp_path):
    files = _shards(tmp_path, {"domain": 1, "general": 1})
    mixture = _mixture({"domain": 0.5, "general": 0.5}, stages=[{"step": 100, "weights": {"general": 0.0}}])
    tracker = MixtureTracker([f for fs in files.values() for f in fs], 16, 64, mixture, files)
    drawn = _drawn(tracker, 0, 200, 16)
    assert abs(np.mean(np.array(drawn[:1600]) == 0) - 0.5) < 0.02
    assert set(drawn[1600:]) == {0}  # from step 100 on, domain only
    assert _drawn(tracker, 150, 10, 16) == drawn[150 * 16: 160 * 16]


@pytest.mark.quick
def test_temperature_weighs_sources_by_their_size():
    cfg = RunConfig.from_dict({"corpus": {"sources": {"big": {"source": "/b"}, "small": {"source": "/s"}},
                                          "weight_temperature": 0.5}})
    mixture = mixture_for(cfg.corpus, {"big": 10_000, "small": 100}, seed=0)
    (_, probs), = mixture.stages
    assert probs == pytest.approx((10 / 11, 1 / 11))  # sqrt(10000) : sqrt(100)


@pytest.mark.quick
def test_blocks_are_whole_steps_and_the_shares_exact_over_a_block():
    assert block_size(48) % 48 == 0 and block_size(48) >= 1024
    counts = counts_before(_mixture({"a": 0.9, "b": 0.1}), 8, 10 * block_size(8))
    assert list(counts) == [9 * block_size(8), block_size(8)]  # no rounding drift over blocks


def test_each_phase_continues_the_draw_rather_than_repeating_it():
    """A phase's mixture (Mixture.between) keys its blocks from its global first step: phase 2 draws
    other sources than phase 1 did, still by the weights, with the closed-form counts exact."""
    from tpu_ray.train.mixture import choices

    whole = _mixture({"a": 0.5, "b": 0.5})
    first, second = whole.between(0, 200), whole.between(200, 400)
    draws = [list(choices(m, 8, 0).take(1024).as_numpy_iterator()) for m in (first, second)]
    assert draws[0] != draws[1]  # the same key (block 0) for both phases drew these twice
    assert draws[0] == list(choices(whole, 8, 0).take(1024).as_numpy_iterator())  # phase 1 is the run's draw
    assert first.digest == whole.digest and second.digest != whole.digest
    for n in (0, 5, 1000, 1024):
        assert list(counts_before(second, 8, n)) == list(np.bincount(draws[1][:n], minlength=2))


# ---------------------------------------------------------------- bad mixtures: one line, exit 2
BAD = {
    "negative weight": ("domain: {source: a.txt, weight: -0.5}\n    general: {source: b.txt}",
                        "corpus.sources.domain.weight=-0.5"),
    "all weights 0": ("domain: {source: a.txt, weight: 0}\n    general: {source: b.txt, weight: 0}",
                      "every weight is 0"),
    "a name used twice": ("domain: {source: a.txt}\n    domain: {source: b.txt}", "key 'domain' is given twice"),
    "a split's name": ("validation: {source: a.txt}\n    general: {source: b.txt}",
                       "corpus.sources.validation: the name clashes"),
    "evaluation only without validation text": (
        "domain: {source: a.txt}\n    general: {source: b.txt, weight: 0, validation_fraction: 0}",
        "corpus.sources.general: weight 0 (evaluation only) with validation_fraction=0"),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.quick
def test_a_bad_mixture_is_one_line_and_exit_2(case, tmp_path, capsys):
    from tpu_ray.cli import main

    sources, needle = BAD[case]
    config = tmp_path / "mix.yaml"
    config.write_text(f"corpus:\n  sources:\n    {sources}\n")
    code = main(["run", "--config", str(config), "--output-dir", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and not out, err
    assert not (tmp_path / "run").exists()  # refused before anything is written


@pytest.mark.quick
def test_a_weight_schedule_whose_steps_go_backwards_is_refused():
    with pytest.raises(UserError, match=r"corpus.weight_schedule\[1\].step=50: steps must increase"):
        RunConfig.from_dict({"corpus": {"sources": {"a": {"source": "/a"}, "b": {"source": "/b"}},
                                        "weight_schedule": [{"step": 100, "weights": {"a": 1}},
                                                            {"step": 50, "weights": {"b": 1}}]}})


@pytest.mark.quick
def test_a_source_inherits_what_corpus_sets_and_the_one_source_form_stays():
    cfg = RunConfig.from_dict({"corpus": {"text_field": "body", "sources": {
        "a": {"source": "/a.jsonl"}, "b": {"source": "/b.jsonl", "text_field": "content"}}}})
    assert cfg.corpus.sources["a"].text_field == "body" and cfg.corpus.sources["b"].text_field == "content"
    with pytest.raises(UserError, match="corpus.source / corpus.validation_source and corpus.sources both given"):
        cfg.override({"corpus.source": "/other.txt"})


# ---------------------------------------------------------------- a real three-source run (conftest.mixed_run)
def test_a_three_source_run_evaluates_each_source_at_every_evaluation(mixed_run):
    from tpu_ray.report import load_metrics

    cfg, result = mixed_run
    df = load_metrics(cfg.run_dir)
    per_source = df[df["kind"] == "eval_source"]
    assert sorted(set(zip(per_source["step"], per_source["source"]))) == [
        (s, n) for s in (20, 40) for n in ("domain", "general", "general_test")]
    assert per_source["bits_per_byte"].notna().all() and (per_source["eval_mask_prob"] == 0.15).all()
    # The same set at every evaluation: one identity per source, different between sources.
    identities = per_source.groupby("source")["eval_set"].nunique()
    assert (identities == 1).all() and per_source["eval_set"].nunique() == 3


def test_a_three_source_run_draws_80_20_and_nothing_from_the_evaluation_only_source(mixed_run):
    cfg, result = mixed_run
    drawn = json.loads(Path(cfg.run_dir, "summary.json").read_text())["training"]["source_samples"]
    assert set(drawn) == {"domain", "general"} and sum(drawn.values()) == 40 * 32
    assert abs(drawn["domain"] / (40 * 32) - 0.8) < 0.03, drawn


def test_the_manifest_knows_the_source_of_every_shard(mixed_run):
    from tpu_ray.prepare.shard_set import ShardSet

    cfg, _ = mixed_run
    shards = ShardSet.open(cfg.shards_dir)
    assert shards.source_names() == ["domain", "general", "general_test"]
    assert shards.evaluation_only("general_test") and not shards.files("train", "general_test")
    assert shards.files("validation", "general_test") and shards.files("train", "domain")
    assert {shards.source_of(e) for e in shards.entries} == {"domain", "general", "general_test"}


def test_changing_the_weights_on_resume_is_a_change_of_data_order(mixed_run):
    from tpu_ray.pipeline import Pipeline

    cfg, _ = mixed_run
    more = cfg.override({"train.steps": 50, "train.extend_schedule": True, "corpus.sources.general.weight": 0.5})
    with pytest.raises(UserError, match="another data order .*mixture"):
        Pipeline(more).train(resume=True)


@pytest.mark.quick
def test_a_mixture_manifest_keeps_the_sources_in_unit_order_and_refuses_gaps(tmp_path):
    """The manifest is written with sorted keys: 'zeta' before 'alpha' in the config stays so."""
    from tpu_ray.prepare.shard_set import ShardSet

    class Tok:
        sha256, vocab_size, cls_id, sep_id, pad_id, unk_id, mask_id = "a" * 64, 100, 0, 2, 1, 3, 4

    entry = {"split": "train", "samples": 1, "tokens": 8, "bytes": 10, "sha256": "b" * 64}
    results = {u: {"shards": [{**entry, "path": f"train/train-{u:05d}-1.tfrecord", "unit": u}], "tokens": 6,
                   "dropped_tokens": 0} for u in (0, 1)}
    ShardSet.from_results(str(tmp_path), seq_len=8, tok=Tok, source={}, plan_sha256="c" * 64, units=2,
                          results=results, complete=True,
                          sources={"zeta": {"units": [0, 1], "evaluation_only": False},
                                   "alpha": {"units": [1, 2], "evaluation_only": False}}).write()
    loaded = ShardSet.load(str(tmp_path))
    assert loaded.source_names() == ["zeta", "alpha"]
    assert [loaded.source_of(e) for e in loaded.entries] == ["zeta", "alpha"]
    data = json.loads((tmp_path / "manifest.json").read_text())
    data["sources"]["alpha"]["units"] = [2, 3]  # a gap: unit 1 belongs to no source
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="sources.alpha is not a source entry"):
        ShardSet.load(str(tmp_path))


@pytest.mark.quick
def test_the_reserved_source_names_cover_the_splits():
    from tpu_ray.config import RESERVED_SOURCE_NAMES
    from tpu_ray.prepare.shard_set import SPLITS
    from tpu_ray.prepare.sources import ONE_SOURCE

    assert set(SPLITS) | {ONE_SOURCE} <= set(RESERVED_SOURCE_NAMES)
