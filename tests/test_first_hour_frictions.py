"""First-hour frictions with mixtures, corpus files, example configs, the model card and continued
runs, each refused or explained in one line.

No training, no Ray, no TensorFlow subprocess: all quick.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError


@pytest.mark.quick
def test_yaml_merge_keys_are_read_as_yaml_defines_them(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("corpus:\n  sources:\n    a: &src {source: a.txt, weight: 0.5, validation_fraction: 0.1}\n"
                    "    b: {<<: *src, source: b.txt}\n")
    cfg = RunConfig.from_yaml(str(path))
    assert cfg.corpus.sources["b"].source == "b.txt" and cfg.corpus.sources["b"].weight == 0.5


@pytest.mark.quick
def test_a_key_given_twice_is_still_refused_beside_merge_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  steps: 30\n  steps: 40\n")
    with pytest.raises(UserError, match="given twice"):
        RunConfig.from_yaml(str(path))


@pytest.mark.quick
@pytest.mark.parametrize("key, value", [("train.steps", "yes"), ("train.learning_rate", "true"),
                                        ("eval.samples", "off"), ("train.mask_prob", "false")])
def test_a_yaml_boolean_where_a_number_is_meant_is_refused_naming_the_field(tmp_path, key, value):
    section, field = key.split(".")
    path = tmp_path / "c.yaml"
    path.write_text(f"{section}:\n  {field}: {value}\n")
    with pytest.raises(UserError) as err:
        RunConfig.from_yaml(str(path))
    assert key in str(err.value) and "boolean" in str(err.value) and len(str(err.value).splitlines()) == 1
    with pytest.raises(UserError, match="boolean"):
        RunConfig.from_dict({}).override([f"{key}={value}"])


@pytest.mark.quick
def test_booleans_stay_booleans_where_they_are_meant():
    cfg = RunConfig.from_dict({"train": {"whole_word_mask": True}, "tokenizer": {"lowercase": True}})
    assert cfg.train.whole_word_mask is True and cfg.tokenizer.lowercase is True


@pytest.mark.quick
def test_a_saved_mixture_config_names_no_second_corpus(tmp_path):
    """config.yaml once kept corpus.source's default (builtin:python-docs) beside sources."""
    cfg = RunConfig.from_dict({"corpus": {"sources": {"a": {"source": "a.txt", "weight": 1}}}})
    text = cfg.to_yaml()
    assert "builtin:python-docs" not in text
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert RunConfig.from_yaml(str(path)).fingerprint() == cfg.fingerprint()


@pytest.mark.quick
@pytest.mark.parametrize("typo, meant", [("--ouput-dir", "--output-dir"), ("--fill_mask", "--fill-mask"),
                                         ("--confg=jobs/configs/quickstart.yaml", "--config")])
def test_a_mistyped_flag_gets_a_suggestion_and_exit_2(capsys, typo, meant):
    from tpu_ray.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["run", "--config", "jobs/configs/quickstart.yaml", typo, "x"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert f"did you mean {meant}?" in err, err


@pytest.mark.quick
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


@pytest.mark.quick
def test_relative_weights_are_printed_as_the_shares_they_give():
    """Before, `weight: 9` beside `0.1` trained 98.9% / 1.1% without a word (the docs called a
    weight "the share")."""
    from tpu_ray.train.mixture import mixture_for, shares_line

    cfg = RunConfig.from_dict({"corpus": {"sources": {"domain": {"source": "d.txt", "weight": 9},
                                                      "general": {"source": "g.txt", "weight": 0.1}},
                                          "weight_schedule": [{"step": 100, "weights": {"general": 1}}]}})
    line = shares_line(cfg.corpus, mixture_for(cfg.corpus, {"domain": 50, "general": 50}, seed=0))
    assert "weights are relative" in line
    assert "from step 0: domain 9 -> 98.9%, general 0.1 -> 1.1%" in line
    assert "from step 100: domain 9 -> 90.0%, general 1 -> 10.0%" in line


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


@pytest.mark.quick
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


@pytest.mark.quick
def test_the_model_card_explains_the_torch_name_error_where_it_gives_the_call():
    """The plain pipeline("fill-mask", model=...) fails in tpu-ray's own environment (no torch) with
    NameError: torch, which only docs/run-directory.md explained; the model card says so too."""
    from tpu_ray.train.export_safetensors import model_card, run_record

    card = model_card(run_record(RunConfig.from_dict({})), 10, 800, "roberta", mask="<mask>")
    use = card[card.index("## Use"):card.index("## The run's config")]
    assert "NameError: name 'torch' is not defined" in use and 'framework="tf", dtype=None' in use


@pytest.mark.quick
def test_a_continued_run_saved_before_its_config_recorded_the_checkpoints_tokenizer_still_resumes(tmp_path):
    """A continued run's config.yaml takes tokenizer.kind / vocab_size and model.preset from the
    checkpoint; one saved before it did held the defaults there. Those fields follow the checkpoint (pinned
    by model.init_sha256), so they are no reason to refuse the run's own tokenizer and shards; any
    other run changing them still is."""
    from tpu_ray.saved_config import check_config, save_config

    for init_from, refused in (("runs/quickstart/model", False), (None, True)):
        run = tmp_path / str(refused)
        before = RunConfig.from_dict({"output_dir": str(run), "model": {"init_from": init_from}})
        save_config(before, False, {})
        (run / "tokenizer").mkdir(parents=True)
        (run / "tokenizer" / "tokenizer.json").write_text("{}")
        now = before.override({"tokenizer.kind": "bpe", "tokenizer.vocab_size": 2000, "model.preset": "mini"})
        if refused:
            with pytest.raises(UserError, match="tokenizer.kind"):
                check_config(now)
        else:
            assert check_config(now) is True  # config.yaml rewritten with what the run trains


@pytest.mark.quick
@pytest.mark.parametrize("argv, says", [
    (["train", "--corpus", "data/x.txt"], "`tpu-ray train` has no --corpus; run, tokenizer, shard and submit take it"),
    (["train", "--fill-mask", "a [MASK]."], "`tpu-ray train` has no --fill-mask; run takes it"),
    (["train", "--ouput-dir", "runs/x"], "--ouput-dir: did you mean --output-dir?")])
def test_a_flag_the_subcommand_lacks_is_named_with_the_subcommands_that_take_it(capsys, argv, says):
    """`tpu-ray train --corpus X` said "(--corpus: did you mean --corpus?)": the flag exists, only
    not for train (which reads existing shards)."""
    from tpu_ray.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err.startswith("tpu-ray train: error: unrecognized arguments:"), err
    assert says in err and "did you mean --corpus" not in err and err.endswith("see tpu-ray train --help"), err


@pytest.mark.quick
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


@pytest.mark.quick
def test_a_hub_source_that_cannot_be_reached_names_its_own_field(tmp_path):
    """"...; point corpus.source at them" for a mixture's corpus.sources.general_test.source; and
    without HF_HUB_OFFLINE an unreachable Hub took ~25 s of datasets' retries before the error."""
    import socket
    import subprocess
    import sys

    from tpu_ray.prepare.tabular import hub_data_files

    field = "corpus.sources.general_test.source"
    with pytest.raises(UserError) as err:  # the suite runs with HF_HUB_OFFLINE=1
        hub_data_files("wikitext", "wikitext-2-v1", "test", field)
    assert f"point {field} at them" in str(err.value) and "HF_HUB_OFFLINE is set" in str(err.value), err.value
    with socket.socket() as s:  # a port nothing listens on: the Hub's endpoint refuses at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    code = (f"from tpu_ray.prepare.tabular import hub_data_files\n"
            f"try: hub_data_files('wikitext', 'wikitext-2-v1', 'test', {field!r})\n"
            f"except Exception as exc: print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "HF_ENDPOINT": f"http://127.0.0.1:{port}"}, cwd=tmp_path)
    assert (f"the Hugging Face Hub is not reachable (127.0.0.1:{port}: Connection refused)" in out.stdout
            and f"point {field} at them" in out.stdout), out.stdout + out.stderr


@pytest.mark.quick
def test_counting_token_frequencies_raises_no_warning_a_user_cannot_act_on(tmp_path):
    """Every run with model.output_bias=unigram (the quickstart's) printed TensorFlow's UserWarning
    "The `deterministic` argument has no effect unless ... num_parallel_calls"."""
    import warnings

    import numpy as np

    from tpu_ray.prepare.tfrecord import serialize_examples, write_records
    from tpu_ray.train.output_bias import token_log_frequencies

    rows = np.arange(2 * 3 * 8).reshape(2, 3, 8) % 20 + 5
    files = []
    for i, part in enumerate(rows):
        path = tmp_path / f"train-{i:05d}-3.tfrecord"
        with open(path, "wb") as f:
            write_records(f, serialize_examples(part.astype(np.int64)))
        files.append(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _log_p, counted = token_log_frequencies({"corpus": (1.0, [(f, 3) for f in files])}, 8, 32,
                                                never_counted=[0, 1, 2])
    assert counted.tokens == rows.size  # every id here is maskable: all counted


@pytest.mark.quick
def test_a_branchs_summary_says_where_it_branched(tmp_path):
    """A decay branched off a stable run at step 200 said "300 (resumed at 200)": it never ran
    steps 0-200 itself and was never resumed. Records written by the trainer's own writer."""
    import json

    from tpu_ray.metrics_stream import MetricsWriter
    from tpu_ray.report import text_summary

    def summary_of(run, resumed_at=None):
        run.mkdir()
        writer = MetricsWriter(str(run))
        writer.event("branch", stage="train", step=200, checkpoint="stable/checkpoints/ckpt-200", source="stable")
        for step in (250, 300):
            writer.write("train", step=step, loss=3.0, accuracy=0.3)
        writer.close()
        (run / "summary.json").write_text(json.dumps({"steps": 300, "resumed_from": resumed_at or 200}))
        return next(line for line in text_summary(str(run)).splitlines() if line.strip("│ ").startswith("steps "))

    line = summary_of(tmp_path / "branch")
    assert "300 (branched from step 200)" in line and "resumed" not in line, line
    line = summary_of(tmp_path / "resumed-branch", resumed_at=250)
    assert "300 (branched from step 200, resumed at 250)" in line, line


@pytest.mark.quick
def test_a_branch_reads_its_stable_runs_shards_and_tokenizer_unless_told_otherwise(tmp_path, small_corpus):
    """A branch had to be given shard.dir= and tokenizer.path= by hand (`tpu-ray run` refused it,
    telling to add them) though it is refused unless they are the stable run's."""
    from tests.helpers import stable_run_and_branch
    from tpu_ray.saved_config import save_config
    from tpu_ray.train.branch import settled

    stable, branch = stable_run_and_branch(tmp_path, small_corpus)
    got = settled(branch)
    assert (got.shards_dir, got.tokenizer_dir) == (stable.shards_dir, stable.tokenizer_dir)
    # told otherwise: its own, checked as before
    with pytest.raises(UserError, match="this run has no shards at"):
        settled(branch.override({"shard.dir": str(tmp_path / "elsewhere")}))
    # a resumed branch keeps what its first start read (its config.yaml), not today's default
    save_config(got, False, {})
    (tmp_path / "branch" / "checkpoints").mkdir()
    (tmp_path / "branch" / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-6"\n')
    again = settled(branch)
    assert (again.shard.dir, again.tokenizer.path) == (stable.shards_dir, stable.tokenizer_dir)


def test_a_branch_finds_a_moved_stable_runs_data_beside_its_config(tmp_path, small_corpus):
    """The stable run's config.yaml names where it was written (output_dir), not where it is now: a
    moved or copied run is found by where its config.yaml is, never at its old path."""
    import shutil

    from tests.helpers import tiny_config
    from tpu_ray.saved_config import save_config
    from tpu_ray.train.branch import stable_data

    stable = tiny_config(tmp_path / "old", small_corpus, **{"train.schedule": "constant", "train.steps": 12})
    save_config(stable, False, {})
    (tmp_path / "old" / "shards").mkdir()
    shutil.move(tmp_path / "old", tmp_path / "new")
    (tmp_path / "old" / "shards").mkdir(parents=True)  # something else now lies at the old path
    branch = stable.override({"output_dir": str(tmp_path / "branch"), "train.branch_from": str(tmp_path / "new")})
    got = branch.override(stable_data(branch.shard.dir, branch.tokenizer.path, str(tmp_path / "new")))
    assert (got.shard.dir, got.tokenizer.path) == (str(tmp_path / "new" / "shards"), str(tmp_path / "new" / "tokenizer"))
