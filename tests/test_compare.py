"""Runs compared side by side: `tpu_ray.compare` and `tpu-ray compare RUN...`.

Run directories are written as a training run writes them (metrics.jsonl, config.yaml, summary.json;
tests/test_report.py's make_run), then given different configs, evaluation sets and sources.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_report import PNG_MAGIC, make_run
from tpu_ray.cli import main
from tpu_ray.comparison import PAGE, PLOTS, write_comparison

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def _run(path: Path, config: str, eval_set: str, tokenizer: str = "aaaa", scale: float = 1.0) -> str:
    """A run whose evaluations name `eval_set`, with two sources' evaluations and `config`."""
    make_run(path, partial=False)
    recs = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    out = []
    for r in recs:
        if r.get("kind") == "train":
            r["loss"] *= scale
        if r.get("kind") == "eval":
            r.update(eval_loss=r["eval_loss"] * scale, eval_set=eval_set, eval_mask_prob=0.15, bits_per_byte=0.5 * scale)
            out.append(r)
            for i, name in enumerate(("domain", "general")):
                out.append({"kind": "eval_source", "step": r["step"], "time": r["time"] + 0.1, "source": name,
                            "eval_loss": r["eval_loss"] + i, "perplexity": 2.0 ** (r["eval_loss"] + i),
                            "bits_per_byte": 0.4 + i / 10, "eval_set": f"{eval_set}-{name}", "eval_mask_prob": 0.15})
            continue
        out.append(r)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    (path / "config.yaml").write_text(config)
    summary = json.loads((path / "summary.json").read_text())
    (path / "summary.json").write_text(json.dumps({**summary, "tokenizer": {"sha256": tokenizer}}))
    return str(path)


BASE = "name: demo\nmodel:\n  preset: tiny\ntrain:\n  steps: 500\n  batch_size: 32\n"


@pytest.fixture
def runs(tmp_path) -> list[str]:
    a = _run(tmp_path / "lr-1e-4", BASE, "set1")
    b = _run(tmp_path / "lr-3e-4", BASE + "  learning_rate: 0.0003\n", "set1", scale=0.9)
    c = _run(tmp_path / "bigger", BASE.replace("batch_size: 32", "batch_size: 64") + "tokenizer:\n  vocab_size: 900\n",
             "set2", tokenizer="bbbb", scale=1.1)
    return [a, b, c]


def test_compare_is_one_frame_with_run_group_and_the_differing_config_keys(runs):
    from tpu_ray import compare

    df = compare(runs)
    assert list(df.columns[:2]) == ["run", "eval_group"]
    assert df.attrs["differing"] == ["tokenizer.vocab_size", "train.batch_size", "train.learning_rate"]
    for key in df.attrs["differing"]:
        assert key in df.columns
    assert set(df["kind"]) == {"train", "eval", "eval_source"}  # the events are not figures
    assert df["run"].drop_duplicates().tolist() == runs
    per_run = df.groupby("run", sort=False).first()
    assert per_run["train.learning_rate"].tolist() == [0.0001, 0.0003, 0.0001]
    assert per_run["train.batch_size"].tolist() == [32, 32, 64]
    # The first two scored one set with one tokenizer: comparable; the third is not.
    assert per_run["eval_group"].tolist() == ["A", "A", "B"]
    assert len(df[(df["run"] == runs[0]) & (df["kind"] == "eval_source")]) == 6


def test_compare_of_identical_configs_has_no_config_columns(tmp_path):
    from tpu_ray import compare

    runs = [_run(tmp_path / "a", BASE, "s"), _run(tmp_path / "b", BASE, "s")]
    df = compare(runs)
    assert df.attrs["differing"] == [] and set(df["eval_group"]) == {"A"}


def test_the_page_overlays_the_runs_and_marks_the_runs_not_comparable(runs, tmp_path):
    paths = write_comparison(runs, str(tmp_path / "out"))
    assert sorted(paths) == sorted((*PLOTS, PAGE))
    for name in PLOTS:
        data = Path(paths[name]).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, name
    page = Path(paths[PAGE]).read_text()
    assert "NOT COMPARABLE across groups" in page and "tokenizer, evaluation set" in page
    assert "bits/byte" in page and "perplexity" in page
    for key in ("train.learning_rate", "train.batch_size", "tokenizer.vocab_size"):
        assert key in page
    assert "domain: ppl / bits/byte" in page


def test_the_plots_hold_one_line_per_run(runs, tmp_path):
    from tpu_ray.comparison import compare

    df = compare(runs)
    figs = _drawn(df, runs, tmp_path)
    labels = [line.get_label() for line in figs["compare_loss.png"].axes[0].get_lines()]
    assert labels == ["lr-1e-4 train", "lr-1e-4 eval [eval A]", "lr-3e-4 train", "lr-3e-4 eval [eval A]",
                      "bigger train", "bigger eval [eval B]"]
    assert len(figs["compare_eval_sources.png"].axes[0].get_lines()) == 6  # 3 runs x 2 sources
    assert len(figs["compare_learning_rate.png"].axes[0].get_lines()) == 3
    assert len(figs["compare_throughput.png"].axes[0].get_lines()) == 3


def test_the_cli_writes_the_page_and_prints_the_table(runs, tmp_path, capsys):
    assert main(["compare", *runs, "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "cmp" / PAGE).exists()
    assert "eval_group" in out and "bits/byte" in out and "NOT COMPARABLE" in out
    assert "train.learning_rate: lr-1e-4=0.0001, lr-3e-4=0.0003, bigger=0.0001" in out


def test_the_cli_refuses_a_missing_run_in_one_line(runs, tmp_path, capsys):
    assert main(["compare", runs[0], str(tmp_path / "nope"), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"run directory not found: {tmp_path / 'nope'}" in err
    assert not (tmp_path / "cmp").exists()


def test_a_run_without_a_saved_config_differs_in_nothing(tmp_path):
    from tpu_ray import compare

    runs = [_run(tmp_path / "a", BASE, "s"), _run(tmp_path / "b", BASE + "  learning_rate: 0.0003\n", "s"),
            _run(tmp_path / "c", BASE, "s")]
    (tmp_path / "c" / "config.yaml").unlink()
    df = compare(runs)
    assert df.attrs["differing"] == ["train.learning_rate"]
    assert df.groupby("run", sort=False)["train.learning_rate"].first().tolist()[:2] == [0.0001, 0.0003]


def test_the_page_goes_to_gs(runs, gcs_emulator):
    from tpu_ray import storage

    bucket = gcs_emulator.make_bucket()
    paths = write_comparison(runs, f"{bucket}/cmp")
    assert paths[PAGE] == f"{bucket}/cmp/{PAGE}"
    assert "tpu-ray run comparison" in storage.read_text(paths[PAGE])
    assert storage.read_bytes(f"{bucket}/cmp/{PLOTS[0]}")[:8] == PNG_MAGIC


def _scored(path: Path, config, pooled: str, sources: dict[str, str], tokenizer: str = "aaaa") -> str:
    """A run written by the real config writer, whose evaluations name `pooled` (the pooled set) and
    `sources` ({source: its set}), as a run's evaluation records do (train/evaluation.py)."""
    from tpu_ray.saved_config import save_config

    make_run(path, partial=False)
    recs = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    out = []
    for r in recs:
        if r.get("kind") == "eval":
            for i, (name, identity) in enumerate(sources.items()):
                out.append({"kind": "eval_source", "step": r["step"], "time": r["time"], "source": name,
                            "eval_loss": r["eval_loss"] + i, "eval_set": identity, "eval_mask_prob": 0.15})
            r.update(eval_set=pooled, eval_mask_prob=0.15)
        out.append(r)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    save_config(config.override({"output_dir": str(path)}), False, {})
    summary = json.loads((path / "summary.json").read_text())
    (path / "summary.json").write_text(json.dumps({**summary, "tokenizer": {"sha256": tokenizer}}))
    return str(path)


@pytest.fixture(scope="module")
def continued(tmp_path_factory) -> list[str]:
    """The quickstart (one source, 500 steps, exported with its step) and the replay example continued
    from its model: the continued run's config as the run resolves it (the checkpoint's sizes and
    tokenizer filled in), its RUN/init copy of the export's config.json, and its `general` source
    scored on the very set the quickstart's evaluation scored."""
    import shutil

    from transformers import RobertaConfig

    from tests.helpers import REPO
    from tpu_ray.config import RunConfig
    from tpu_ray.train.export import config_digest, stamp_provenance
    from tpu_ray.train.init_from import checkpoint_fields

    tmp_path = tmp_path_factory.mktemp("continued")
    parent_cfg = RunConfig.from_yaml(str(REPO / "jobs" / "configs" / "quickstart.yaml")).override(
        {"tokenizer.kind": "unigram", "tokenizer.vocab_size": 800})
    parent = _scored(tmp_path / "quickstart", parent_cfg, "set-P", {"corpus": "set-P"})
    model = tmp_path / "quickstart" / "model"
    RobertaConfig(vocab_size=800, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                  max_position_embeddings=514, layer_norm_eps=1e-5, pad_token_id=1).save_pretrained(str(model))
    (model / "tf_model.h5").write_bytes(b"")  # checkpoint_fields reads the sizes; no weights are loaded here
    for f in (REPO / "tests" / "data" / "kept_tokenizer").iterdir():  # a stored Unigram 800: nothing trained
        shutil.copy(f, model / f.name)
    stamp_provenance(str(model), config_digest(parent_cfg.fingerprint()), 500)
    child_cfg = RunConfig.from_yaml(str(REPO / "jobs" / "configs" / "continue_with_replay.yaml")).override(
        {"model.init_from": str(model), "output_dir": str(tmp_path / "continued")})
    child_cfg = child_cfg.override(checkpoint_fields(child_cfg.init_spec))
    child = _scored(tmp_path / "continued", child_cfg, "set-C",
                    {"domain": "set-D", "general": "set-P", "domain_test": "set-T"})
    (tmp_path / "continued" / "init").mkdir()
    shutil.copy(model / "config.json", tmp_path / "continued" / "init" / "config.json")  # the run's own copy
    return [parent, child]


def test_a_continuation_differs_from_its_parent_only_where_a_figure_changes(continued):
    """Both models are hidden 128 (the quickstart's by its preset, the continued run's from the
    checkpoint): no size, tokenizer or logging field is a difference; the start, data and recipe are."""
    from tpu_ray import compare

    keys = compare(continued).attrs["differing"]
    noise = [k for k in keys if k.startswith(("model.hidden_size", "model.num_", "model.intermediate_size",
                                              "model.max_position", "model.preset", "model.initializer_range",
                                              "model.output_bias", "tokenizer.", "train.log_every",
                                              "train.eval_every", "train.checkpoint_every", "name"))]
    assert noise == [], keys
    assert {"model.init_from", "corpus", "corpus.sources.domain", "train.steps", "train.learning_rate"} <= set(keys)
    assert len(keys) <= 16, keys


def test_a_continuation_is_drawn_at_its_global_step(continued, tmp_path):
    """The continued run's steps 10..500 follow its checkpoint's step 500: drawn at 510..1000."""

    from tpu_ray.comparison import compare

    df = compare(continued)
    assert df.attrs["start_step"] == {continued[0]: 0, continued[1]: 500}
    figs = _drawn(df, continued, tmp_path)
    lines = {line.get_label(): line.get_xdata() for line in figs["compare_loss.png"].axes[0].get_lines()}
    assert min(lines["quickstart train"]) == 10 and max(lines["quickstart train"]) == 500
    assert min(lines["continued (from step 500) train"]) == 510
    assert max(lines["continued (from step 500) train"]) == 1000
    sources = [line.get_label() for line in figs["compare_eval_sources.png"].axes[0].get_lines()]
    shared = [label for label in sources if label.endswith("[shared set 1]")]  # one set, scored by both
    assert [label.split(" (")[0].split(":")[0] for label in shared] == ["quickstart", "continued"], sources


def test_a_continuation_scoring_its_parents_set_is_comparable_on_it(continued, capsys):
    """The continued run's `general` source is the quickstart's evaluation set (one identity): the
    runs compare on it, though their pooled evaluations (one source, three) do not."""
    assert main(["compare", *continued, "--out", str(Path(continued[0]).parent / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "NOT COMPARABLE" not in out, out
    assert "Comparable on the sets they share: quickstart's evaluation = continued's 'general'" in out, out
    assert "model.hidden_size" not in out


@pytest.fixture(scope="module")
def third_generation(continued, tmp_path_factory) -> list[str]:
    """Two runs continued from the continued run B (which went on from the quickstart A's export at
    step 500 and trained 500 steps of its own): C from B's export, stamped as the trainer stamps it
    (run_record: B's start), and D from B's run directory, copied by the real first stage (own_copy:
    its last checkpoint ckpt-500 and, as the copy's config.json, B's model config, which still
    carries A's export provenance). Both follow global step 1000, not B's local 500."""
    import shutil

    from tests.helpers import REPO
    from tpu_ray.config import RunConfig
    from tpu_ray.saved_config import read_saved_config
    from tpu_ray.train.export import stamp_provenance
    from tpu_ray.train.export_safetensors import run_record
    from tpu_ray.train.init_from import checkpoint_fields, own_copy

    parent, child = map(Path, continued)
    tmp_path = tmp_path_factory.mktemp("third")
    if not (child / "model").exists():
        shutil.copytree(parent / "model", child / "model")  # B's export: A's files (no weights are read here)
        record = run_record(read_saved_config(str(child)))
        stamp_provenance(str(child / "model"), record.config_sha256, 500, record.start_step)
        shutil.copytree(REPO / "tests" / "data" / "kept_tokenizer", child / "tokenizer")  # B's: its checkpoint's
        ckpts = child / "checkpoints"
        ckpts.mkdir()
        for name in ("ckpt-500.index", "ckpt-500.data-00000-of-00001"):
            (ckpts / name).write_bytes(b"")  # the names own_copy picks by; no weights are loaded here
        (ckpts / "checkpoint").write_text('model_checkpoint_path: "ckpt-500"\nall_model_checkpoint_paths: "ckpt-500"\n')
    out = []
    for name, source in (("from_export", child / "model"), ("from_run", child)):
        cfg = RunConfig.from_yaml(str(REPO / "jobs" / "configs" / "continue_with_replay.yaml")).override(
            {"model.init_from": str(source), "output_dir": str(tmp_path / name)})
        cfg = cfg.override({"model.init_sha256": own_copy(cfg.init_spec)})
        cfg = cfg.override(checkpoint_fields(cfg.init_spec))
        out.append(_scored(tmp_path / name, cfg, "set-C", {"domain": "set-D", "general": "set-P", "domain_test": "set-T"}))
    return [str(parent), str(child), *out]


def test_a_continuation_of_a_continuation_is_drawn_after_both(third_generation, tmp_path):
    """C (from B's export) and D (from B's checkpoint ckpt-500) start at A's 500 + B's 500: B's
    export records global step 1000 beside its own step 500, and D's copy names B's checkpoint,
    whose run started at 500 (D's copy's config.json says 500 too: A's export's, left in B's config)."""
    from tpu_ray.comparison import compare

    parent, child, from_export, from_run = third_generation
    provenance = json.loads((Path(child) / "model" / "config.json").read_text())["tpu_ray_export"]
    assert (provenance["step"], provenance["global_step"]) == (500, 1000)
    copy = Path(from_run) / "init"
    assert 'model_checkpoint_path: "ckpt-500"' in (copy / "checkpoints" / "checkpoint").read_text()
    assert json.loads((copy / "config.json").read_text())["tpu_ray_export"]["step"] == 500  # A's, not B's start
    df = compare(third_generation)
    assert df.attrs["start_step"] == {parent: 0, child: 500, from_export: 1000, from_run: 1000}
    figs = _drawn(df, third_generation, tmp_path)
    lines = {line.get_label(): line.get_xdata() for line in figs["compare_loss.png"].axes[0].get_lines()}
    for name in ("from_export", "from_run"):
        assert (min(lines[f"{name} (from step 1,000) train"]), max(lines[f"{name} (from step 1,000) train"])) == (1010, 1500)


@pytest.mark.parametrize("made, start", [
    ({"step": 500, "global_step": "900"}, 500), ({"step": 500, "global_step": True}, 500),
    ({"step": 500, "global_step": -900}, 500), ({"step": 500, "global_step": 200}, 500),  # below its own step
    ({"step": 500, "global_step": 900.0}, 500), ({"step": True}, 0), ({"step": -500}, 0), ({"step": "500"}, 0),
    ("500", 0), ({"step": 500, "global_step": 900}, 900),
    ({"step": 500, "global_step": 2**63}, 500), ({"step": 10**30}, 0)])  # past any run: wraps int64 in pandas
def test_a_hostile_provenance_places_nothing(tmp_path, made, start):
    """A continued run's copy of a config.json whose provenance is not a count (a string, a bool, a
    negative or fractional number, a global step below the local one) is ignored, never drawn by."""
    from tpu_ray import compare

    run = _run(tmp_path / "continued", BASE, "s")
    (tmp_path / "continued" / "init").mkdir()
    (tmp_path / "continued" / "init" / "config.json").write_text(json.dumps({"model_type": "roberta",
                                                                            "tpu_ray_export": made}))
    drawn = compare([run]).attrs["start_step"][run]
    assert drawn == start and type(drawn) is int  # True == 1: a bool is not a step


def test_a_copy_keeps_the_global_start_it_was_made_at_when_its_parent_run_is_gone(third_generation, tmp_path):
    """D's copy of B's checkpoint recorded its start (1000) while B was there to read: a copy of D
    whose source run is gone (moved, deleted) still starts there, not at ckpt-500 alone."""
    import shutil

    from tpu_ray.resume import global_start

    from_run = Path(third_generation[3])
    record = json.loads((from_run / "init" / "source.json").read_text())
    assert record["global_start"] == 1000
    moved = tmp_path / "moved"
    shutil.copytree(from_run, moved)
    (moved / "init" / "source.json").write_text(json.dumps({**record, "resolved": str(tmp_path / "gone"),
                                                            "source": str(tmp_path / "gone")}))
    assert global_start(str(moved)) == 1000
    del record["global_start"]  # a copy made before the start was recorded: its checkpoint alone, a lower bound
    (moved / "init" / "source.json").write_text(json.dumps({**record, "resolved": str(tmp_path / "gone")}))
    assert global_start(str(moved)) == 500


def _drawn(df, runs, tmp_path) -> dict:
    """{file name: the matplotlib Figure} plot_compare saved, kept as it was drawn (its lines readable)."""
    import matplotlib.figure

    from tpu_ray.comparison import plot_compare

    figs = {}
    real = matplotlib.figure.Figure.savefig

    def keep(self, path, *a, **k):
        figs[Path(path).name] = self
        return real(self, path, *a, **k)

    matplotlib.figure.Figure.savefig = keep
    try:
        plot_compare(df, runs, {name: str(tmp_path / name) for name in PLOTS})
    finally:
        matplotlib.figure.Figure.savefig = real
    return figs


def _started(run: str, **fields) -> str:
    """`run` with a train_start event carrying what its training resolved (precision, ...)."""
    path = Path(run) / "metrics.jsonl"
    start = {"kind": "event", "event": "train_start", "stage": "train", "step": 0, "time": 0.5, **fields}
    path.write_text(json.dumps(start) + "\n" + path.read_text())
    return run


def test_auto_and_the_setting_it_chose_are_one_setting_but_an_extended_schedule_shows(tmp_path):
    from tpu_ray import compare

    ran = {"precision": "float32", "steps_per_execution": 4, "jit_compile": False}
    auto = _started(_run(tmp_path / "auto", BASE, "s"), **ran)
    explicit = _started(_run(tmp_path / "explicit", BASE + "  mixed_precision: float32\n  steps_per_execution: 4\n"
                             "  jit_compile: false\n", "s"), **ran)
    assert compare([auto, explicit]).attrs["differing"] == []
    other = _started(_run(tmp_path / "bf16", BASE, "s"), **{**ran, "precision": "mixed_bfloat16"})
    assert compare([auto, other]).attrs["differing"] == ["train.mixed_precision"]
    never_resumed = _started(_run(tmp_path / "set", BASE + "  extend_schedule: true\n", "s"), **ran)
    assert compare([auto, never_resumed]).attrs["differing"] == []  # it acts only at a resume
    extended = _started(_started(_run(tmp_path / "extended", BASE + "  extend_schedule: true\n", "s"), **ran), **ran)
    assert compare([auto, extended]).attrs["differing"] == ["train.extend_schedule"]  # its curve bent at the resume


def test_what_ran_on_a_tpu_a_resumed_change_and_an_unstarted_run_are_told_apart_rightly(tmp_path):
    from tpu_ray import compare

    ran = {"precision": "mixed_bfloat16", "steps_per_execution": 64, "device_kind": "tpu"}
    unset = _started(_run(tmp_path / "unset", BASE, "s"), **ran)  # a TPU records jit_compile as null
    given = _started(_run(tmp_path / "given", BASE + "  jit_compile: true\n", "s"), **ran)
    assert compare([unset, given]).attrs["differing"] == []
    resumed = _started(_started(_run(tmp_path / "resumed", BASE, "s"), **{**ran, "precision": "float32"}), **ran)
    fp32 = _started(_run(tmp_path / "fp32", BASE, "s"), **{**ran, "precision": "float32"})
    df = compare([resumed, fp32])  # bfloat16 first, float32 after the resume: not a float32 run throughout
    assert df.attrs["differing"] == ["train.mixed_precision"]
    assert set(df["train.mixed_precision"]) == {"mixed_bfloat16 -> float32", "float32"}
    never = _run(tmp_path / "never", BASE, "s")  # no train_start: unknown, not different
    assert compare([never, fp32]).attrs["differing"] == []
