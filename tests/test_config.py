"""Config loading, overrides and one-line validation errors naming the field."""

import pytest

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


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


@pytest.mark.parametrize("model_type,positions,eps,type_vocab", [("roberta", 514, 1e-5, 1), ("bert", 512, 1e-12, 2)])
def test_model_defaults_are_the_published_configuration(model_type, positions, eps, type_vocab):
    """16.4: the exported config.json says what roberta-base's / bert-base's says, whatever seq_len."""
    from tpu_ray.prepare.tokenizer import TokenizerInfo
    from tpu_ray.train.model import hf_config

    cfg = RunConfig.from_dict({"model": {"model_type": model_type}, "shard": {"seq_len": 64}})
    tok = TokenizerInfo(sha256="", vocab_size=1000, cls_id=0, pad_id=1, sep_id=2, unk_id=3, mask_id=4)
    hf = hf_config(cfg.model_spec, tok)
    assert (hf.max_position_embeddings, hf.layer_norm_eps, hf.type_vocab_size) == (positions, eps, type_vocab)
    assert cfg.max_input_tokens() == 512  # the tokenizer's model_max_length: fine-tune on 512 tokens
    explicit = cfg.override({"model.max_position_embeddings": 130, "model.layer_norm_eps": 1e-7})
    assert (hf_config(explicit.model_spec, tok).max_position_embeddings, hf_config(explicit.model_spec, tok).layer_norm_eps) == (130, 1e-7)


def test_seq_len_is_checked_against_the_published_positions():
    assert RunConfig.from_dict({"shard": {"seq_len": 512}, "model": {"model_type": "bert"}}).positions_needed() == 512
    RunConfig.from_dict({"shard": {"seq_len": 512}})  # RoBERTa: 512 + 2 = 514 fits
    with pytest.raises(UserError, match=r"shard.seq_len=513 needs model.max_position_embeddings >= 515 "
                                        r"\(roberta positions start at 2\), got 514"):
        RunConfig.from_dict({"shard": {"seq_len": 513}})
    with pytest.raises(UserError, match="needs model.max_position_embeddings >= 513"):
        RunConfig.from_dict({"shard": {"seq_len": 513}, "model": {"model_type": "bert"}})


def test_removed_eval_pad_multiple_still_loads_and_is_gone():
    """train.eval_pad_multiple never did anything: removed; configs that name it still load."""
    from tpu_ray.config import RunConfig

    cfg = RunConfig.from_dict({"train": {"eval_pad_multiple": 64, "steps": 5}})
    assert cfg.train.steps == 5 and "eval_pad_multiple" not in cfg.to_yaml()


def test_multiworker_training_is_refused_until_its_open_ports_are_declared_firewalled(tmp_path, capsys):
    """train.workers>1 started TensorFlow gRPC servers listening on 0.0.0.0 without authentication
    (TensorFlow 2.21 binds every interface whatever TF_CONFIG names: `ss -ltn` shows `*:PORT`)."""
    from tests.helpers import tiny_config
    from tpu_ray.cli import main

    with pytest.raises(UserError, match=r"train\.workers=2: .*gRPC ports on every interface .*no authentication"
                                        r".*train\.workers_network_closed=true") as err:
        tiny_config(tmp_path / "run", tmp_path / "c.txt", **{"train.workers": 2})
    assert "\n" not in str(err.value)
    assert tiny_config(tmp_path / "run", tmp_path / "c.txt",
                       **{"train.workers": 2, "train.workers_network_closed": True}).train.workers == 2
    (tmp_path / "c.txt").write_text("some text\n")
    code = main(["shard", "--corpus", str(tmp_path / "c.txt"), "--output-dir", str(tmp_path / "run"),
                 "train.workers=2", "ray.address=local"])
    assert code == 2 and "train.workers_network_closed=true" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before anything ran
