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
@pytest.mark.quick
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
        assert hf_config(cfg.model_spec, info).pad_token_id == 1


@pytest.mark.parametrize("value, why", [("tapas", "table structure"), ("layoutlm", "bounding boxes"),
                                        ("gpt2", "not a TensorFlow masked-LM type")])
@pytest.mark.quick
def test_an_unsupported_model_type_is_one_line_naming_why(value, why):
    from tpu_ray.config import RunConfig

    with pytest.raises(UserError) as err:
        RunConfig().override({"model.model_type": value})
    msg = str(err.value)
    assert msg.startswith(f'override: model.model_type="{value}"') and why in msg and "\n" not in msg


@pytest.mark.quick
def test_flops_per_token_follow_the_family(tmp_path):
    """The xlm and flaubert families project every position onto the vocabulary (their FFN is 4 x
    hidden, their head the projection alone); funnel halves the sequence after each block and runs
    its decoder at full length. BERT keeps the gathered-head count."""
    from tpu_ray.config import RunConfig
    from tpu_ray.train.inputs import predictions_for
    from tpu_ray.train.model import train_flops_per_token

    def cfg(model_type: str) -> RunConfig:
        return RunConfig.from_dict({"model": {"model_type": model_type, "hidden_size": 64, "num_hidden_layers": 3,
                                              "intermediate_size": 128, "num_attention_heads": 2},
                                    "shard": {"seq_len": 64}})

    def flops(c: RunConfig, vocab: int) -> float:
        return train_flops_per_token(c.model, c.train, c.shard.seq_len, vocab)

    h, inter, seq, vocab = 64, 128, 64, 1000
    k = predictions_for(cfg("bert").train, seq)

    def layer(q: int, kv: int, ffn: int) -> int:
        return 2 * q * h * h + 2 * kv * h * h + 2 * q * h * ffn + 2 * q * kv * h

    bert = 6 * (3 * layer(seq, seq, inter) + (h * h + h * vocab) * k) / seq
    assert flops(cfg("bert"), vocab) == pytest.approx(bert)
    xlm = 6 * (3 * layer(seq, seq, 4 * h) + h * vocab * seq) / seq
    for model_type in ("xlm", "flaubert"):
        assert flops(cfg(model_type), vocab) == pytest.approx(xlm)
    # funnel from scratch: blocks [1, 1, 1] at 64, 32 (queries pooled from 64), 16 (from 32); decoder 2 x 64
    funnel = 6 * (layer(64, 64, inter) + layer(32, 64, inter) + layer(16, 32, inter) + 2 * layer(64, 64, inter)
                  + h * vocab * k) / seq
    assert flops(cfg("funnel"), vocab) == pytest.approx(funnel)


@pytest.mark.quick
def test_xlm_special_tokens_are_never_random_replacements(tmp_path, small_corpus):
    """XLM's <special0>..<special9> (added special tokens) are never drawn by the 10% random
    replacement, nor masked: the trainer's MaskSpec counts them as special."""
    import numpy as np
    import tensorflow as tf

    from tpu_ray.config import TokenizerConfig
    from tpu_ray.families import family, training_order
    from tpu_ray.prepare.tokenizer import save_tokenizer, tokenizer_info, train_tokenizer
    from tpu_ray.train.loop import mask_spec

    fam = family("xlm")
    lines = [s for s in small_corpus.read_text().splitlines() if s.strip()][:2000]
    tok = train_tokenizer([lines], TokenizerConfig(vocab_size=300), fam.tokens, training_order(fam))
    tok.add_special_tokens([f"<special{i}>" for i in range(10) if i != 1])  # <special1> is the mask already
    out = str(tmp_path / "tokenizer")
    info = save_tokenizer(tok, out, 64, fam.tokens)
    extra = {tok.token_to_id(f"<special{i}>") for i in range(10)}
    cfg = tiny_config(tmp_path / "run", small_corpus, **{"model.model_type": "xlm", "tokenizer.path": out})
    spec = mask_spec(cfg.train, cfg.paths, tokenizer_info(out))
    drawn = spec.random_ids(tf.constant([200_000]), tf.constant([1, 2], tf.int64), tf.int32).numpy()
    assert not set(np.unique(drawn)) & extra and drawn.max() < info.vocab_size
    assert extra <= set(spec.never_masked)
