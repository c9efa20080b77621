"""The family registry as the stages read it: tokenizers trained for a family get its conventional
special tokens at its ids; tokenizers made before (tpu-ray's mixed set) still load and train."""

from __future__ import annotations

import pytest

from tests.helpers import tiny_config
from tpu_ray.errors import UserError


@pytest.mark.parametrize("model_type, tokens, ids", [
    ("roberta", ("<s>", "<pad>", "</s>", "<unk>", "<mask>"), (0, 1, 2, 3, 4)),  # pad = 1, as TF RoBERTa needs
    ("bert", ("[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"), (2, 0, 3, 1, 4)),  # bert-base: [PAD] = 0
])
def test_the_tokenizer_stage_gives_the_family_its_own_special_tokens(tmp_path, small_corpus, model_type, tokens, ids):
    from transformers import AutoTokenizer

    from tpu_ray.pipeline import Pipeline

    cfg = tiny_config(tmp_path / "run", small_corpus, **{"model.model_type": model_type, "tokenizer.vocab_size": 300})
    info = Pipeline(cfg).tokenizer()
    assert info.special_tokens == tokens
    assert (info.cls_id, info.pad_id, info.sep_id, info.unk_id, info.mask_id) == ids
    tok = AutoTokenizer.from_pretrained(cfg.tokenizer_dir)  # what transformers users see
    assert (tok.cls_token, tok.pad_token, tok.sep_token, tok.unk_token, tok.mask_token) == tokens
    enc = tok("a line")["input_ids"]
    assert enc[0] == info.cls_id and enc[-1] == info.sep_id


def test_a_tokenizer_with_the_old_mixed_set_still_describes_and_configures(tiny_tokenizer_dir, tmp_path):
    """Runs made before families (`[CLS] <pad> [SEP] <unk> [MASK]`) keep working for RoBERTa and BERT."""
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.model import hf_config

    info = tokenizer_info(tiny_tokenizer_dir)
    assert info.special_tokens == ("[CLS]", "<pad>", "[SEP]", "<unk>", "[MASK]") and info.pad_id == 1
    for model_type in ("roberta", "bert"):
        cfg = tiny_config(tmp_path, tmp_path / "x.txt", **{"model.model_type": model_type,
                                                           "tokenizer.path": tiny_tokenizer_dir})
        assert hf_config(cfg, info).pad_token_id == 1


@pytest.mark.parametrize("value, why", [("tapas", "table structure"), ("layoutlm", "bounding boxes"),
                                        ("gpt2", "not a TensorFlow masked-LM type")])
def test_an_unsupported_model_type_is_one_line_naming_why(value, why):
    from tpu_ray.config import RunConfig

    with pytest.raises(UserError) as err:
        RunConfig().override({"model.model_type": value})
    msg = str(err.value)
    assert msg.startswith(f'override: model.model_type="{value}"') and why in msg and "\n" not in msg
