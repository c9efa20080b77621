"""Tokenizer training (Unigram, BPE, WordPiece), the transformers-loadable directory, its hash;
and the built-in corpus the quickstart trains on."""

from __future__ import annotations

import json

import pytest

from tpu_ray.config import SPECIAL_TOKENS, TokenizerConfig
from tpu_ray.prepare.tokenizer import save_tokenizer, tokenizer_info, train_tokenizer


@pytest.fixture(scope="module")
def lines(small_corpus) -> list[str]:
    return [s for s in small_corpus.read_text().splitlines() if s.strip()][:1500]


@pytest.mark.parametrize("kind", ["unigram", "bpe", "wordpiece"])
def test_each_kind_saves_a_directory_transformers_loads(tmp_path, lines, kind):
    from transformers import AutoTokenizer

    info = save_tokenizer(train_tokenizer([lines], TokenizerConfig(kind=kind, vocab_size=600)), str(tmp_path), 128)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    # RoBERTa's id layout: [CLS]=0 <pad>=1 [SEP]=2 <unk>=3, then [MASK]; TF RoBERTa pads with id 1.
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tok.cls_token, tok.pad_token, tok.sep_token, tok.unk_token, tok.mask_token) == SPECIAL_TOKENS
    assert (info.cls_id, info.pad_id, info.sep_id, info.unk_id, info.mask_id) == (0, 1, 2, 3, 4)
    assert 500 <= info.vocab_size <= 600 and len(tok) == info.vocab_size
    ids = tok("The river flows [MASK] the sea.")["input_ids"]
    assert ids[0] == 0 and ids[-1] == 2 and 4 in ids  # [CLS] ... [SEP], the mask token kept whole
    assert tok.model_max_length == 128


@pytest.mark.quick
def test_the_hash_names_the_content(tmp_path, lines):
    # A run trains its tokenizer once and records this hash in the manifest: a retrained tokenizer
    # (the same text, another process) has the same hash (test below).
    bpe = TokenizerConfig(kind="bpe", vocab_size=600)
    a = save_tokenizer(train_tokenizer([lines], bpe), str(tmp_path / "a"), 128)
    b = save_tokenizer(train_tokenizer([lines], bpe), str(tmp_path / "b"), 128)
    c = save_tokenizer(train_tokenizer([lines], bpe.model_copy(update={"vocab_size": 700})), str(tmp_path / "c"), 128)
    assert a.sha256 == b.sha256 != c.sha256  # same content, same hash; other vocabulary, other hash
    assert tokenizer_info(str(tmp_path / "a")) == a
    assert not list(tmp_path.glob("a/.tmp-*"))  # committed atomically: no temp files left


# Trains each kind on the text of argv[1] and writes each tokenizer's JSON to argv[2]/<kind>.json.
_TRAIN_IN_A_FRESH_PROCESS = """
import sys
from pathlib import Path
from tpu_ray.config import TokenizerConfig
from tpu_ray.prepare.tokenizer import train_tokenizer
lines = [s for s in Path(sys.argv[1]).read_text(encoding="utf-8").splitlines() if s.strip()]
for kind in ("unigram", "wordpiece", "bpe"):
    tok = train_tokenizer([lines], TokenizerConfig(kind=kind, vocab_size=800))
    (Path(sys.argv[2]) / f"{kind}.json").write_text(tok.to_str(), encoding="utf-8")
"""


def test_two_processes_train_the_same_tokenizer_to_the_byte(tmp_path, tmp_path_factory):
    """The same text trains the same tokenizer in another process, every kind: `tokenizers`' Unigram
    and WordPiece trainers walk the words in a hash-map order seeded anew in each process (ids,
    scores' last bits and WordPiece's tied merges differed), which canonical_unigram and
    deterministic_wordpiece take out. Two fresh processes, at once: two hash seeds. 120 KB of
    WikiText-2: enough for the old code's Unigram and WordPiece to differ in every pair of runs."""
    import json
    import subprocess
    import sys

    from tests.helpers import wikitext_slice

    text = wikitext_slice(tmp_path_factory, 120_000, "tok120k.txt")
    outs = [tmp_path / "a", tmp_path / "b"]
    procs = []
    for out in outs:
        out.mkdir()
        procs.append(subprocess.Popen([sys.executable, "-c", _TRAIN_IN_A_FRESH_PROCESS, str(text), str(out)],
                                      stderr=subprocess.PIPE, text=True, cwd=tmp_path))
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    differ = []
    for kind in ("unigram", "wordpiece", "bpe"):
        a, b = ((out / f"{kind}.json").read_bytes() for out in outs)
        if a != b:
            va, vb = (json.loads(x)["model"]["vocab"] for x in (a, b))
            pairs = zip(va, vb) if isinstance(va, list) else zip(sorted(va, key=va.get), sorted(vb, key=vb.get))
            differ.append((kind, next(((i, x, y) for i, (x, y) in enumerate(pairs) if x != y), "same vocabulary")))
    assert not differ, f"two processes trained different tokenizers (kind, first differing id): {differ}"


@pytest.mark.quick
def test_builtin_corpus_is_real_python_documentation_and_deterministic(tmp_path):
    from tpu_ray.prepare.readers.builtin import builtin_python_docs, materialize_builtin

    text = builtin_python_docs()
    assert len(text) > 500_000
    assert "Function definitions" in text  # pydoc's topic pages
    assert "Return a new array whose items are restricted by typecode" in text  # a stdlib docstring
    assert text == builtin_python_docs()
    path = materialize_builtin(str(tmp_path))
    assert open(path, encoding="utf-8").read() == text


def test_builtin_corpus_does_not_depend_on_the_environment_or_the_process():
    """CI's quickstart trained on another text than a developer's: setuptools' own distutils (one
    text per setuptools version) stood in for the stdlib's, and Ray, once imported, replaces
    inspect.isgenerator. Only modules of the Python build count, and a fresh process (Ray not yet
    imported) writes the same text as this one."""
    import hashlib
    import json
    import subprocess
    import sys

    import ray  # noqa: F401  (imported here: the fresh process below has not imported it)
    import yaml

    from tpu_ray.prepare.readers.builtin import _from_the_standard_library, builtin_python_docs

    assert _from_the_standard_library(json) and _from_the_standard_library(sys)
    assert not _from_the_standard_library(yaml)  # site-packages
    text = builtin_python_docs()
    assert "Python Module Distribution Utilities" not in text
    code = ("import hashlib, sys; from tpu_ray.prepare.readers.builtin import builtin_python_docs; "
            "assert 'ray' not in sys.modules; print(hashlib.sha256(builtin_python_docs().encode()).hexdigest())")
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert fresh.stdout.split()[-1] == hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.quick
def test_a_vocabulary_far_below_the_one_asked_warns_with_the_reason(caplog):
    """800 asked, a few dozen learnt from one short line: a warning says why."""
    import logging

    with caplog.at_level(logging.WARNING, logger="tpu_ray"):
        tok = train_tokenizer([["Hello there, small text."]], TokenizerConfig(vocab_size=800))
    assert tok.get_vocab_size() < 400
    assert "far below tokenizer.vocab_size=800" in caplog.text and "(1 lines, 24 characters)" in caplog.text


@pytest.mark.quick
def test_whitespace_only_corpus_is_refused_before_training(tmp_path):
    from tpu_ray.config import CorpusConfig, ShardConfig
    from tpu_ray.errors import UserError
    from tpu_ray.prepare.corpus import iter_train_text, plan_units

    path = tmp_path / "blank.txt"
    path.write_text("   \n\t\n \n\n")
    units = plan_units(CorpusConfig(source=str(path)), ShardConfig(), str(tmp_path))
    with pytest.raises(UserError, match="blank.txt: no text to train the tokenizer on"):
        iter_train_text(units, 1 << 20)


def _word_token(tok, word: str) -> int:
    """The id of `word` as a word-initial token ("▁the" for Unigram/BPE, "the" for WordPiece)."""
    ids = tok(" " + word, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, (word, tok.convert_ids_to_tokens(ids))
    return ids[0]


@pytest.mark.parametrize("kind", ["unigram", "bpe", "wordpiece"])
def test_mask_token_takes_the_space_before_it_and_fill_mask_answers_whole_words(tmp_path, lines, kind):
    """16.2: "word [MASK] ." has no stray piece before the mask (RoBERTa's <mask> is lstrip), so a
    model that predicts a word-initial token fills in a whole word, spaced as the text was."""
    import numpy as np
    from transformers import AutoTokenizer, RobertaConfig, TFRobertaForMaskedLM

    from tpu_ray.train.export import fill_mask

    save_tokenizer(train_tokenizer([lines], TokenizerConfig(kind=kind, vocab_size=600)), str(tmp_path), 128)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in ("word [MASK] .", "The river flows [MASK] the sea."):
        pieces = tok.convert_ids_to_tokens(tok(text)["input_ids"])
        before = pieces[pieces.index("[MASK]") - 1]
        assert before.strip("▁ ") and not before.endswith(("▁", " ")), (kind, pieces)
    # A real (tiny) TF RoBERTa whose output bias makes "the" the certain answer.
    model = TFRobertaForMaskedLM(RobertaConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1,
                                               num_attention_heads=2, intermediate_size=32, pad_token_id=1,
                                               bos_token_id=0, eos_token_id=2, max_position_embeddings=130))
    model(model.dummy_inputs)
    bias = np.zeros(len(tok), np.float32)
    bias[_word_token(tok, "the")] = 50.0
    model.lm_head.bias.assign(bias)
    model.save_pretrained(str(tmp_path))
    [top] = fill_mask(str(tmp_path), "word [MASK] .", top_k=1)
    assert top["token_str"].strip() == "the" and top["score"] > 0.99
    # "word the ." (WordPiece's decoder may write "word the."): the answer is a word of its own.
    assert top["sequence"].split()[:2] == ["word", "the"] or top["sequence"] == "word the.", top["sequence"]


# --- special-token roles: the tokenizer's own files, guessing only for a bare tokenizer.json -------
# MPNet's vocabulary: <s> <pad> </s> <unk> first, then BERT's WordPiece entries with [PAD] [UNK]
# [CLS] [SEP] [MASK], and <mask> last: it holds tpu-ray's mixed set, RoBERTa's and BERT's tokens.
MPNET_VOCAB = ["<s>", "<pad>", "</s>", "<unk>", "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "river",
               "flows", "##s", ".", "<mask>"]


def _mpnet_shaped(directory, config: dict | None = None, special_map: dict | None = None) -> str:
    """A bare tokenizer.json of MPNet's vocabulary shape, with the roles files given."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(MPNET_VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    if config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(config))
    if special_map is not None:
        (d / "special_tokens_map.json").write_text(json.dumps(special_map))
    return str(d)


MPNET_ROLES = {"bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
               "pad_token": "<pad>", "unk_token": "[UNK]",
               "mask_token": {"content": "<mask>", "lstrip": True, "special": True}}


@pytest.mark.quick
def test_roles_come_from_the_checkpoints_tokenizer_files(tmp_path):
    """Not the first convention the vocabulary happens to hold ([MASK] of the mixed set): the
    mask the exported tokenizer uses, <mask>, is the one training masks with."""
    info = tokenizer_info(_mpnet_shaped(tmp_path / "cfg", config={"model_max_length": 512, **MPNET_ROLES}))
    assert info.special_tokens == ("<s>", "<pad>", "</s>", "[UNK]", "<mask>")
    assert (info.cls_id, info.pad_id, info.sep_id, info.unk_id, info.mask_id) == (0, 1, 2, 5, 14)
    # special_tokens_map.json overrides tokenizer_config.json, as in transformers
    info = tokenizer_info(_mpnet_shaped(tmp_path / "map", config={"model_max_length": 512, "mask_token": "[MASK]"},
                                        special_map=MPNET_ROLES))
    assert info.mask_id == 14 and info.tokens.mask == "<mask>"


@pytest.mark.quick
def test_a_guess_that_finds_two_conventions_is_refused_in_one_line(tmp_path):
    from tpu_ray.errors import UserError

    bare = _mpnet_shaped(tmp_path / "bare", config={"model_max_length": 512})  # no roles named: a guess
    with pytest.raises(UserError) as err:
        tokenizer_info(bare)
    msg = str(err.value)
    assert "\n" not in msg and "two special-token conventions" in msg
    assert "([CLS] <pad> [SEP] <unk> [MASK])" in msg and "(<s> <pad> </s> <unk> <mask>)" in msg
    assert "tokenizer_config.json" in msg


@pytest.mark.quick
def test_a_role_file_naming_a_token_outside_the_vocabulary_or_lacking_a_role(tmp_path):
    from tpu_ray.errors import UserError

    bad = _mpnet_shaped(tmp_path / "bad", special_map={**MPNET_ROLES, "mask_token": "<MASK>"})
    with pytest.raises(UserError, match=r"special_tokens_map.json: mask_token '<MASK>' is not in the vocabulary"):
        tokenizer_info(bad)
    lacking = _mpnet_shaped(tmp_path / "lack", config={k: v for k, v in MPNET_ROLES.items() if k != "mask_token"})
    with pytest.raises(UserError, match=r"tokenizer_config.json: names no mask_token"):
        tokenizer_info(lacking)


@pytest.mark.quick
def test_canonical_unigram_finds_the_unscored_characters_whatever_the_last_bits():
    """The characters at the bottom of a trained Unigram model sit at its lowest score or 4e-11 above
    it (the trainer's digamma steps where an expected count is a whole number), and which ones do
    depends on the process's summation order: two such vocabularies must canonicalise alike."""
    from tokenizers import Tokenizer, models

    from tpu_ray.prepare.tokenizer import canonical_unigram

    special = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("<mask>", 0.0)]
    low = -10.0

    def trained(noisy: str) -> Tokenizer:  # `noisy` is the character whose score is 4e-11 off
        pieces = [("ab", -5.0), ("c", low + 1e-4)] + [(ch, low + (4e-11 if ch == noisy else 0.0)) for ch in "abd"]
        return Tokenizer(models.Unigram(special + pieces, unk_id=3, byte_fallback=False))

    one, other = (canonical_unigram(trained(ch), len(special)).to_str() for ch in ("a", "b"))
    assert one == other
    vocab = json.loads(one)["model"]["vocab"]
    assert [p for p, _ in vocab[:5]] == [p for p, _ in special]  # special tokens keep ids 0..4
    assert vocab[5] == ["ab", -5.0]


def test_tokenizer_retrain_replaces_the_directory_whole(tmp_path, small_corpus):
    from tpu_ray.config import TokenizerConfig
    from tpu_ray.prepare.tokenizer import save_tokenizer, train_tokenizer

    out = tmp_path / "run" / "tokenizer"
    out.mkdir(parents=True)
    (out / "vocab.txt").write_text("from an older tokenizer\n")  # not written by this one
    lines = [s for s in small_corpus.read_text().splitlines()[:2000] if s.strip()]
    save_tokenizer(train_tokenizer([lines], TokenizerConfig(vocab_size=300)), str(out), 64)
    assert not (out / "vocab.txt").exists() and (out / "tokenizer.json").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["tokenizer"]
