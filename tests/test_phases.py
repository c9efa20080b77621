"""Sequence-length phases (`train.phases`): the shard stage cuts every phase's length from
one tokenization, training compiles once per phase, carries the optimizer and step across the
change and resumes inside a phase; with a mixture each phase draws by the weights; a decay branches
off a phased stable run; bad phases are one line."""

from __future__ import annotations

import json

import pytest

from tests.helpers import tiny_config
from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError

PHASES = [{"steps": 6, "seq_len": 32}, {"steps": 4, "seq_len": 64, "batch_size": 8}]


def _shard(run_dir, corpus, tok_dir, **over):
    """The shard stage's own unit function and manifest writer, in this process (no Ray)."""
    from tpu_ray.prepare.corpus import plan_units
    from tpu_ray.pipeline import shard_job
    from tpu_ray.prepare.shards import process_unit, text_tokenizer, write_sets
    from tpu_ray.prepare.tokenizer import load_tokenizer_json, tokenizer_info
    from tpu_ray.train.phases import extra_lengths

    cfg = tiny_config(run_dir, corpus, **{"tokenizer.path": tok_dir, **over})
    tok, info = text_tokenizer(load_tokenizer_json(tok_dir)), tokenizer_info(tok_dir)
    units = plan_units(cfg.corpus, cfg.shard, cfg.run_dir)
    results = {u.index: process_unit(u, tok, info, cfg.shard.seq_len, cfg.shards_dir,
                                     extra_lengths=extra_lengths(cfg.train.phases, cfg.shard.seq_len)) for u in units}
    write_sets(shard_job(cfg), info, units, results, complete=True)
    return cfg


@pytest.fixture(scope="module")
def phased(tmp_path_factory, small_corpus, tiny_tokenizer_dir):
    run = tmp_path_factory.mktemp("phased") / "run"
    return _shard(run, small_corpus, tiny_tokenizer_dir, **{"train.phases": PHASES, "train.steps": 10,
                                                             "model.dropout": 0.0})


def test_one_reading_cuts_each_phase_length_and_leaves_the_full_length_shards_as_they_were(
        phased, tmp_path, small_corpus, tiny_tokenizer_dir):
    from tests.helpers import manifest_json

    assert (phased.train.steps, phased.shard.seq_len) == (10, 64)  # the phases' sum and longest length
    plain = _shard(tmp_path / "plain", small_corpus, tiny_tokenizer_dir)
    ours, theirs = manifest_json(phased.shards_dir), manifest_json(plain.shards_dir)
    assert ours == theirs  # no phases: the same shards, the same manifest
    short = manifest_json(f"{phased.shards_dir}/seq-32")
    assert short["seq_len"] == 32 and short["complete"] and short["plan_sha256"] == ours["plan_sha256"]
    assert short["splits"]["validation"]["shards"] == []  # evaluation runs at shard.seq_len
    # The same train tokens, cut at 32: every token of the long cut is in the short one's tokens count.
    long_tokens = sum(s["tokens"] for s in ours["unit_stats"])
    assert sum(s["tokens"] for s in short["unit_stats"]) < long_tokens  # train only, no validation lines
    assert short["splits"]["train"]["samples"] > 2 * ours["splits"]["train"]["samples"] - len(ours["unit_stats"]) * 2


def _records(run, kind):
    return [r for r in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]

def _cut_back(run, to: int, dropped: int) -> None:
    """Leave the run as if it had stopped after checkpoint `to`: checkpoint `dropped` and the
    metrics gone, the checkpoint index pointing at `to` (what a lost slice leaves)."""
    ckpts = run / "checkpoints"
    for p in ckpts.glob(f"ckpt-{dropped}.*"):
        p.unlink()
    (ckpts / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{to}"\nall_model_checkpoint_paths: "ckpt-{to}"\n')
    (run / "metrics.jsonl").unlink()


def test_a_phases_run_compiles_once_per_phase_and_resumes_inside_the_second(phased, tmp_path):
    from tpu_ray.train.loop import train

    run = tmp_path / "run"
    cfg = phased.override({"output_dir": str(run), "shard.dir": phased.shards_dir, "train.log_every": 1,
                           "train.checkpoint_every": 4, "train.eval_every": 10, "train.placement": "local"})
    summary = train(cfg)
    first = {r["step"]: r for r in _records(run, "train")}
    assert sorted(first) == list(range(1, 11)) and summary["steps"] == 10
    assert [first[s]["seq_len"] for s in range(1, 11)] == [32] * 6 + [64] * 4
    # One compile per phase: the trace count is 1 through phase 1 and 2 through phase 2.
    assert [first[s]["train_traces"] for s in range(1, 11)] == [1] * 6 + [2] * 4
    assert summary["train_traces"] == 2
    # Each phase_start records the share of the text the phases before read (phase 2 continues
    # after it): 0, then phase 1's 96 samples at 32 over that length's train bytes (tests/test_phase_data.py).
    from tests.test_phase_data import _plan

    starts = [r for r in _records(run, "event") if r["event"] == "phase_start"]
    assert [r["text_read"] for r in starts] == pytest.approx(_plan(cfg)[2].text_read(), rel=1e-12)
    assert starts[0]["text_read"] == 0 and 0 < starts[1]["text_read"] < 0.2
    # The throughput follows the phase: samples/s x seq_len (batch 16, then the phase's own 8).
    for s, (batch, length) in {3: (16, 32), 9: (8, 64)}.items():
        assert first[s]["tokens_per_s"] == pytest.approx(first[s]["samples_per_s"] * length)
        assert first[s]["samples_per_s"] == pytest.approx(batch / first[s]["step_time_s"])
    # Cut back to the step-8 checkpoint (inside phase 2) and resume: the same losses as uninterrupted.
    _cut_back(run, to=8, dropped=10)
    assert train(cfg, resume=True)["resumed_from"] == 8
    again = {r["step"]: r for r in _records(run, "train")}
    assert sorted(again) == [9, 10] and again[10]["train_traces"] == 1  # only phase 2 compiled
    for step in again:
        assert again[step]["loss"] == pytest.approx(first[step]["loss"], rel=1e-5), step
    (resume,) = [r for r in _records(run, "event") if r["event"] == "resume"]
    assert resume["step"] == 8
    stored = json.loads((run / "checkpoints" / "ckpt-10.position.json").read_text())  # 4 steps x 8 from phase 2's start
    assert (stored["phase"], stored["step"], stored["samples"]) == (1, 10, 32)
    assert stored["stream"]["epoch"] == 0 and stored["stream"]["read_units"] >= 1  # after the units phase 1 read


@pytest.mark.parametrize("over, needle", [
    ({"train.phases": [{"steps": 10, "seq_len": 1024}]},
     "train.phases[0].seq_len=1024 needs model.max_position_embeddings >= 1026, got 514"),
    ({"train.phases": [{"steps": 0, "seq_len": 64}]}, "train.phases.0.steps=0"),
    ({"train.phases": [{"steps": 10, "seq_len": 4}]}, "train.phases.0.seq_len=4"),
    ({"train.steps": 50, "train.phases": PHASES}, "train.steps=50 conflicts with train.phases, whose steps sum to 10"),
    ({"train.phases": PHASES, "train.steps": 10, "train.schedule": "wsd", "train.decay_steps": 20},
     "train.decay_steps=20 is longer than the run (train.steps=10)"),
    ({"train.phases": PHASES, "train.steps": 10, "shard.seq_len": 128}, "must be the longest phase's seq_len (64)"),
])
@pytest.mark.quick
def test_bad_phases_are_one_line_and_exit_2(over, needle, tmp_path, capsys):
    from tpu_ray.cli import main

    args = [f"{k}={json.dumps(v)}" for k, v in over.items()]
    assert main(["train", "--output-dir", str(tmp_path / "r"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1], err


@pytest.mark.quick
def test_phases_from_yaml_fill_in_steps_and_the_longest_length(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  phases:\n    - {steps: 90, seq_len: 128}\n    - {steps: 10, seq_len: 512}\n")
    cfg = RunConfig.from_yaml(path)
    assert (cfg.train.steps, cfg.shard.seq_len) == (100, 512)
    assert RunConfig().fingerprint() == RunConfig.from_dict({}).fingerprint()
    assert "phases" not in RunConfig().fingerprint()["train"]  # runs without phases keep their fingerprint


def test_doctor_plans_each_phase_and_names_missing_phase_shards(phased, tmp_path):
    import io
    import shutil

    from tpu_ray.doctor.checks import FAIL, PASS, run_doctor

    def rows(cfg):
        out = io.StringIO()
        run_doctor(cfg, target="cpu", out=out, xla=False)
        return {r[6:21].strip(): r for r in out.getvalue().splitlines() if r[:6].strip() in (PASS, FAIL, "WARN")}

    got = rows(phased)
    assert got["phases"].startswith(PASS) and "6 steps at 32 -> 4 steps at 64 batch 8" in got["phases"]
    assert "x 6 steps at [16, 32]" in got["capacity plan"] and "x 4 steps at [8, 64]" in got["capacity plan"]
    copy = tmp_path / "shards"
    shutil.copytree(phased.shards_dir, copy)
    shutil.rmtree(copy / "seq-32")
    got = rows(phased.override({"shard.dir": str(copy)}))
    assert got["phases"].startswith(FAIL) and "no complete shards at seq_len 32" in got["phases"], got["phases"]


def test_the_shard_stage_on_ray_writes_and_resumes_every_phase_length(phased, tmp_path, small_corpus,
                                                                      tiny_tokenizer_dir, ray_local):
    import hashlib
    from pathlib import Path

    from tpu_ray.prepare.shards import make_shards
    from tpu_ray.pipeline import shard_job

    def digest(d):
        return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(d).rglob("*"))
                if p.is_file()}

    cfg = tiny_config(tmp_path / "run", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir, "train.phases": PHASES})
    first = make_shards(shard_job(cfg), actors=2)
    expected = digest(phased.shards_dir)  # the in-process cut of the same corpus: the same bytes on Ray
    assert digest(cfg.shards_dir) == expected and "seq-32/manifest.json" in expected
    assert make_shards(shard_job(cfg), actors=2).skipped_units == first.units  # all committed, at every length
    (Path(cfg.shards_dir) / "seq-32" / "manifest.json").unlink()  # a phase length's set lost: its units redone
    assert make_shards(shard_job(cfg), actors=2).skipped_units == 0
    assert digest(cfg.shards_dir) == expected


def test_each_phase_masks_at_its_own_rate_with_its_own_static_bound(tiny_tokenizer_dir):
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.loop import mask_spec
    from tpu_ray.train.plan import plan

    cfg = RunConfig.from_dict({"train": {"mask_count": "exact", "mask_prob": 0.15, "batch_size": 32,
                                         "phases": [{"steps": 90, "seq_len": 32, "mask_prob": 0.4, "batch_size": 64},
                                                    {"steps": 10, "seq_len": 64}]}})
    tok = tokenizer_info(tiny_tokenizer_dir)
    spans = plan(cfg.train, cfg.corpus, cfg.paths).spans
    got = [(sp.seq_len, sp.batch_size, mask_spec(cfg.train, cfg.paths, tok, sp.span).mask_prob, mask_spec(cfg.train, cfg.paths, tok, sp.span).predictions)
           for sp in spans]
    assert got == [(32, 64, 0.4, 13), (64, 32, 0.15, 10)]
    assert spans[0].shards_dir.endswith("/seq-32") and spans[1].shards_dir == cfg.shards_dir


# ------------------------------------------------------------------ phases with a mixture (corpus.sources)
MIX_PHASES = [{"steps": 8, "seq_len": 16, "batch_size": 128}, {"steps": 8, "seq_len": 32, "batch_size": 128}]


def _shard_sources(run_dir, sources, tok_dir, **over):
    """_shard for a mixture: every source's units (plan_sources), cut at every phase length."""
    from tpu_ray.pipeline import shard_job
    from tpu_ray.prepare.shards import process_unit, text_tokenizer, write_sets
    from tpu_ray.prepare.sources import all_units, plan_sources
    from tpu_ray.prepare.tokenizer import load_tokenizer_json, tokenizer_info
    from tpu_ray.train.phases import extra_lengths

    base = tiny_config(run_dir, run_dir).model_dump(mode="json", exclude={"corpus"})
    cfg = RunConfig.from_dict({**base, "corpus": {"sources": sources, "validation_fraction": 0.1}}).override(
        {"tokenizer.path": tok_dir, **over})
    tok, info = text_tokenizer(load_tokenizer_json(tok_dir)), tokenizer_info(tok_dir)
    planned = plan_sources(cfg.corpus, cfg.shard, cfg.run_dir)
    results = {u.index: process_unit(u, tok, info, cfg.shard.seq_len, cfg.shards_dir,
                                     extra_lengths=extra_lengths(cfg.train.phases, cfg.shard.seq_len)) for u in all_units(planned)}
    write_sets(shard_job(cfg), info, planned, results, complete=True)
    return cfg


def test_a_mixture_with_phases_draws_by_weight_in_each_phase_and_resumes_in_the_second(
        tmp_path, small_corpus, tiny_tokenizer_dir):
    from tpu_ray.prepare.shard_set import ShardSet
    from tpu_ray.train.loop import train

    lines = small_corpus.read_text().splitlines(keepends=True)
    (tmp_path / "a.txt").write_text("".join(lines[: len(lines) // 2]))
    (tmp_path / "b.txt").write_text("".join(lines[len(lines) // 2:]))
    sources = {"a": {"source": str(tmp_path / "a.txt"), "weight": 3}, "b": {"source": str(tmp_path / "b.txt")}}
    run = tmp_path / "run"
    cfg = _shard_sources(run, sources, tiny_tokenizer_dir, **{
        "train.phases": MIX_PHASES, "model.dropout": 0.0, "train.log_every": 1, "train.checkpoint_every": 4,
        "train.eval_every": 16, "train.placement": "local"})
    short = ShardSet.open(f"{cfg.shards_dir}/seq-16")  # per-source files in the phase's set, as in the main one
    assert short.source_names() == ["a", "b"] and short.files("train", "a") and short.files("train", "b")
    summary = train(cfg)
    first = {r["step"]: r for r in _records(run, "train")}
    assert [first[s]["seq_len"] for s in range(1, 17)] == [16] * 8 + [32] * 8
    # 0.75 / 0.25 in each phase: each phase is one block of 1,024 samples, where the shares are exact.
    assert (first[8]["samples/a"], first[8]["samples/b"]) == (768, 256)
    assert (first[16]["samples/a"], first[16]["samples/b"]) == (1536, 512)
    assert summary["training"] == {"source_samples": {"a": 1536, "b": 512},
                                   "phase_source_samples": [{"a": 768, "b": 256}, {"a": 768, "b": 256}]}
    per_source = [r for r in _records(run, "eval_source")]  # evaluation per source, at shard.seq_len
    assert {r["source"] for r in per_source} == {"a", "b"}
    # Cut back to the step-12 checkpoint (inside phase 2) and resume: the same losses as uninterrupted.
    _cut_back(run, to=12, dropped=16)
    assert train(cfg, resume=True)["resumed_from"] == 12
    again = {r["step"]: r for r in _records(run, "train")}
    assert sorted(again) == list(range(13, 17))
    for step in again:
        assert again[step]["loss"] == pytest.approx(first[step]["loss"], rel=1e-5), step
        assert (again[step]["samples/a"], again[step]["samples/b"]) == (first[step]["samples/a"],
                                                                       first[step]["samples/b"])
    stored = json.loads((run / "checkpoints" / "ckpt-16.position.json").read_text())  # phase 2's own sources' counts
    assert (stored["phase"], stored["sources"]) == (1, {"a": 768, "b": 256})


@pytest.mark.quick
def test_a_weight_stage_takes_effect_at_its_global_step_whichever_phase_holds_it(tmp_path):
    from tests.test_mixture import _drawn, _shards
    from tpu_ray.train.mixture import Mixture, MixtureTracker

    m = Mixture(("a", "b"), ((0, (0.5, 0.5)), (100, (1.0, 0.0)), (300, (0.2, 0.8))), seed=3)
    assert m.between(0, 60).stages == ((0, (0.5, 0.5)),)
    assert m.between(60, 200).stages == ((0, (0.5, 0.5)), (40, (1.0, 0.0)))
    assert m.between(100, 300).stages == ((0, (1.0, 0.0)),)
    assert m.between(150, 400).stages == ((0, (1.0, 0.0)), (150, (0.2, 0.8)))
    assert m.between(0, 1000) == m
    # Phase 2 (steps 60-200) of a run whose weights drop b at step 100: b until its step 40, then none.
    files = _shards(tmp_path, {"a": 1, "b": 1})
    tracker = MixtureTracker([f for fs in files.values() for f in fs], 8, 16, m.between(60, 200), files)
    drawn = _drawn(tracker, 0, 140, 8)
    assert 1 in drawn[: 40 * 8] and set(drawn[40 * 8:]) == {0}
    assert tracker.source_samples(140)["b"] == drawn.count(1)


# ------------------------------------------------------------------ a decay branched off a phased stable run
STABLE = [{"steps": 6, "seq_len": 32}, {"steps": 6, "seq_len": 64, "batch_size": 8}]
BRANCH = [{"steps": 6, "seq_len": 32}, {"steps": 4, "seq_len": 64, "batch_size": 8}]  # the last phase shorter


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_a_decay_branched_inside_the_second_phase_ends_where_the_direct_run_ends(phased, tmp_path):
    from tpu_ray.pipeline import Pipeline

    def run_cfg(name, phases, **over):
        return phased.override({"output_dir": str(tmp_path / name), "shard.dir": phased.shards_dir,
                                "train.phases": phases, "train.log_every": 1, "train.checkpoint_every": 8,
                                "train.eval_every": 100, "train.placement": "local", "train.warmup_steps": 2,
                                **over})

    decay = {"train.schedule": "wsd", "train.decay_steps": 2}
    Pipeline(run_cfg("stable", STABLE, **{"train.schedule": "constant"})).train()
    Pipeline(run_cfg("direct", BRANCH, **decay)).train()
    branch = run_cfg("branch", BRANCH, **decay, **{
        "train.branch_from": str(tmp_path / "stable" / "checkpoints" / "ckpt-8")})
    summary = Pipeline(branch).train()
    assert summary["resumed_from"] == 8 and summary["steps"] == 10
    got = {r["step"]: r for r in _records(tmp_path / "branch", "train")}
    ref = {r["step"]: r for r in _records(tmp_path / "direct", "train")}
    assert sorted(got) == [9, 10] and got[10]["seq_len"] == 64
    for step in got:  # phase 2's stream from the branch step, the same masks, the same updates
        assert got[step]["learning_rate"] == pytest.approx(ref[step]["learning_rate"], rel=1e-6), step
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=1e-5), step
    stored = json.loads((tmp_path / "branch" / "checkpoints" / "ckpt-10.position.json").read_text())
    assert (stored["phase"], stored["step"], stored["samples"]) == (1, 10, 32)


@pytest.mark.parametrize("phases, step, needle", [
    (STABLE, 8, ""),
    (BRANCH, 8, ""),  # the phase holding the branch step ends elsewhere
    ([{"steps": 8, "seq_len": 32}, {"steps": 2, "seq_len": 64}], 6, ""),  # branch at phase 1's end: it goes on
    ([{"steps": 4, "seq_len": 32}, {"steps": 6, "seq_len": 64, "batch_size": 8}], 8,
     "train.phases[0].steps: saved 6, now 4"),
    ([{"steps": 6, "seq_len": 32}, {"steps": 4, "seq_len": 64}], 8, "train.phases[1].batch_size: saved 8, now 32"),
    ([{"steps": 6, "seq_len": 32}, {"steps": 1, "seq_len": 64, "batch_size": 8}, {"steps": 3, "seq_len": 32}], 8,
     "train.phases[1].steps: saved 6, now 1, which ends before step 8"),
    (None, 4, "train.phases[0].seq_len: saved 32, now 64"),
])
@pytest.mark.quick
def test_which_phases_a_branch_may_have(phases, step, needle):
    from tpu_ray.train.phases import spans, trained_difference

    stable = RunConfig.from_dict({"train": {"phases": STABLE}})
    branch = RunConfig.from_dict({"train": {"phases": phases, **({} if phases else {"steps": 10})},
                                  "shard": {"seq_len": 64}})
    assert trained_difference(spans(stable.train, stable.shard.seq_len), spans(branch.train, branch.shard.seq_len),
                              step) == needle


def test_a_branch_with_other_phases_before_its_step_is_one_line_exit_2(phased, tmp_path, capsys):
    from tpu_ray.cli import main
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.saved_config import save_config

    stable = phased.override({"output_dir": str(tmp_path / "stable"), "shard.dir": phased.shards_dir,
                              "train.phases": STABLE, "train.schedule": "constant", "train.placement": "local"})
    save_config(stable, False, {})
    ckpts = tmp_path / "stable" / "checkpoints"
    ckpts.mkdir()
    (ckpts / "checkpoint").write_text('model_checkpoint_path: "ckpt-8"\n')
    (ckpts / "ckpt-8.index").write_bytes(b"")
    branch = stable.override({"output_dir": str(tmp_path / "branch"), "train.branch_from": str(tmp_path / "stable"),
                              "train.schedule": "wsd", "train.decay_steps": 2,
                              "train.phases": [{"steps": 4, "seq_len": 32}, {"steps": 6, "seq_len": 64}]})
    yaml_path = tmp_path / "branch.yaml"
    yaml_path.write_text(branch.to_yaml())
    assert main(["train", "--config", str(yaml_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "train.phases differ from the stable run's over the 8 steps it trained (train.phases[0].steps: " \
           "saved 6, now 4)" in err[-1], err
    with pytest.raises(UserError, match=r"train.phases\[0\].steps: saved 6, now 4"):
        Pipeline(branch).train()
