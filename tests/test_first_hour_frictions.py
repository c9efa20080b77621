"""First-hour frictions of issue 45 (points 5 and 6), each refused or explained in one line.

No training, no Ray, no TensorFlow subprocess: all quick.
"""

from __future__ import annotations

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
    """Issue 45.3: config.yaml kept corpus.source's default (builtin:python-docs) beside sources."""
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
    """Issue 45.5: a .json file holding one JSON array got "not a JSON line" for each of its lines
    and the advice to skip them all."""
    import json

    from tpu_ray.config import CorpusConfig, ShardConfig
    from tpu_ray.prepare.corpus import plan_units, read_unit_text
    from tpu_ray.prepare.preflight import preflight_corpus

    path = tmp_path / "corpus.json"
    path.write_text(json.dumps([{"text": f"record {i}"} for i in range(50)], indent=2))
    cfg = RunConfig.from_dict({"corpus": {"source": str(path)}, "output_dir": str(tmp_path / "run")})
    for check in (lambda: preflight_corpus(cfg),
                  lambda: [read_unit_text(u, "all") for u in plan_units(CorpusConfig(source=str(path)),
                                                                         ShardConfig(), str(tmp_path / "r"))]):
        with pytest.raises(UserError) as err:
            check()
        message = str(err.value)
        assert "one JSON array" in message and "jq -c" in message and "not a JSON line (" not in message, message


@pytest.mark.quick
def test_relative_weights_are_printed_as_the_shares_they_give():
    """Issue 45.5: `weight: 9` beside `0.1` trained 98.9% / 1.1% without a word (the docs called a
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
    """Issue 45.5: an in-memory datasets.IterableDataset whose first 1,024 texts are null ended in a
    raw ArrowNotImplementedError (the first batch's column was typed null, the next string)."""
    import datasets

    from tpu_ray.prepare.given import point, write_given

    rows = [{"text": None}] * 1500 + [{"text": f"line {i} of text"} for i in range(100)]
    ds = datasets.IterableDataset.from_generator(lambda: iter(rows))
    cfg, given = point(RunConfig.from_dict({"output_dir": str(tmp_path / "run")}), ds)
    (record,) = write_given(cfg, given)
    assert record["rows"] == 1600 and record["text_rows"] == 100, record


@pytest.mark.quick
@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parents[1] / "jobs" / "configs").glob("*.yaml")))
def test_every_example_config_reads_data_a_users_clone_reaches(name):
    """Issue 45.6: continue_with_replay.yaml pointed at ../shared/data/..., which exists beside this
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
    """Issue 45.6: the plain pipeline("fill-mask", model=...) fails in tpu-ray's own environment
    (no torch) with NameError: torch, which only docs/run-directory.md explained."""
    from tpu_ray.train.export_safetensors import model_card

    card = model_card(RunConfig.from_dict({}), 10, 800, "roberta", mask="<mask>")
    use = card[card.index("## Use"):card.index("## The run's config")]
    assert "NameError: name 'torch' is not defined" in use and 'framework="tf", dtype=None' in use


@pytest.mark.quick
def test_a_continued_run_saved_before_its_config_recorded_the_checkpoints_tokenizer_still_resumes(tmp_path):
    """Issue 45.3's fix fills tokenizer.kind / vocab_size and model.preset from the checkpoint; a
    continued run saved before held the defaults there. Those fields follow the checkpoint (pinned
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
