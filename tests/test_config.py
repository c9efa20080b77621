"""Config loading, overrides and one-line validation errors naming the field."""

import pytest

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError


def test_quickstart_loads_and_overrides():
    cfg = RunConfig.from_yaml("jobs/configs/quickstart.yaml").override({"train.steps": 7})
    assert cfg.train.steps == 7 and cfg.corpus.source == "builtin:python-docs"
    cfg2 = cfg.override(["shard.seq_len=64", "model.preset=small"])
    assert cfg2.shard.seq_len == 64 and cfg2.model.sizes()["hidden_size"] == 256
    assert RunConfig.from_dict(cfg2.model_dump()) == cfg2


@pytest.mark.parametrize("data,needle", [
    ({"train": {"stepz": 5}}, "unknown key 'train.stepz'; did you mean 'train.steps'?"),
    ({"trian": {}}, "unknown key 'trian'; did you mean 'train'?"),
    ({"train": {"steps": "many"}}, "train.steps=\"many\""),
    ({"train": {"batch_size": 0}}, "train.batch_size=0"),
    ({"shard": {"seq_len": 4}}, "shard.seq_len=4"),
    ({"shard": {"seq_len": 512}, "model": {"max_position_embeddings": 256}}, "max_position_embeddings >= 514"),
    ({"tokenizer": {"kind": "sentencepiece"}}, "tokenizer.kind=\"sentencepiece\""),
])
def test_invalid_values_fail_with_one_line_naming_the_field(data, needle):
    with pytest.raises(UserError) as err:
        RunConfig.from_dict(data)
    message = str(err.value)
    assert needle in message
    assert "\n" not in message


def test_override_unknown_key_suggests(tmp_path):
    with pytest.raises(UserError, match="did you mean 'train.batch_size'"):
        RunConfig().override({"train.batchsize": 3})


def test_malformed_yaml_and_code_tags_are_rejected(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  steps: [1, 2\n")
    with pytest.raises(UserError, match=r"bad.yaml: line \d+, column \d+: malformed YAML"):
        RunConfig.from_yaml(bad)
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(UserError, match="malformed YAML"):
        RunConfig.from_yaml(evil)
