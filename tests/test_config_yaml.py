"""A config file's YAML read as YAML defines it and written back whole: merge keys work, a key
given twice and a YAML boolean where a number is meant are refused naming the field, a saved
mixture config names no second corpus."""

from __future__ import annotations

import pytest

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def test_yaml_merge_keys_are_read_as_yaml_defines_them(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("corpus:\n  sources:\n    a: &src {source: a.txt, weight: 0.5, validation_fraction: 0.1}\n"
                    "    b: {<<: *src, source: b.txt}\n")
    cfg = RunConfig.from_yaml(str(path))
    assert cfg.corpus.sources["b"].source == "b.txt" and cfg.corpus.sources["b"].weight == 0.5


def test_a_key_given_twice_is_still_refused_beside_merge_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  steps: 30\n  steps: 40\n")
    with pytest.raises(UserError, match="given twice"):
        RunConfig.from_yaml(str(path))


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


def test_booleans_stay_booleans_where_they_are_meant():
    cfg = RunConfig.from_dict({"train": {"whole_word_mask": True}, "tokenizer": {"lowercase": True}})
    assert cfg.train.whole_word_mask is True and cfg.tokenizer.lowercase is True


def test_a_saved_mixture_config_names_no_second_corpus(tmp_path):
    """config.yaml once kept corpus.source's default (builtin:python-docs) beside sources."""
    cfg = RunConfig.from_dict({"corpus": {"sources": {"a": {"source": "a.txt", "weight": 1}}}})
    text = cfg.to_yaml()
    assert "builtin:python-docs" not in text
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert RunConfig.from_yaml(str(path)).fingerprint() == cfg.fingerprint()
