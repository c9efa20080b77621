"""Domain vocabulary: `tokenizer.extend_tokens` / `tokenizer.add_tokens_file` extend a
checkpoint's tokenizer in its model's own spelling, and the run grows the model to them.

The learner on each tokenizer kind a checkpoint may have (Unigram, BPE with Metaspace as tpu-ray
trains them, byte-level BPE as RoBERTa's, WordPiece as BERT's); a continued run end to end (the
shards use the new tokens, summary.json and the model card say what was added, fill-mask can
predict them, the run resumes); the vocabulary check accepting exactly the recorded growth; bad
input one line, exit 2. The growth of every family's weights, and PyTorch's logits on new tokens,
are tests/test_model_types.py's test_an_extended_vocabulary_grows_the_model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import tiny_config
from tpu_ray.errors import UserError

SPECIALS = ("<s>", "</s>", "<pad>", "<unk>", "<mask>", "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")


def _base_tokenizer(kind: str, lines: list[str]):
    """A small tokenizer of `kind` as checkpoints ship them (special tokens of the family)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tpu_ray.config import TokenizerConfig
    from tpu_ray.families import family, training_order
    from tpu_ray.prepare.tokenizer import train_tokenizer

    if kind == "bytelevel":  # RoBERTa's: byte-level BPE, no prefix space
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator([lines], trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
        tok.add_special_tokens(["<mask>"])
        return tok
    fam = family("bert" if kind == "wordpiece" else "roberta")
    return train_tokenizer([lines], TokenizerConfig(kind=kind, vocab_size=400), fam.tokens, training_order(fam))


@pytest.fixture(scope="module")
def lines(small_corpus) -> list[str]:
    text = [s for s in small_corpus.read_text().splitlines() if s.strip()][:3000]
    # Special tokens' strings written in the text, often: never learned as vocabulary.
    return text + [" ".join(SPECIALS) + " <mask>x [MASK]s" for _ in range(300)]


@pytest.mark.parametrize("kind", ["unigram", "bpe", "bytelevel", "wordpiece"])
def test_learned_tokens_are_new_distinct_never_special_and_used_on_text(lines, kind, tmp_path):
    from tokenizers import Tokenizer

    from tpu_ray.prepare.vocabulary import Speller, count_words, install, learn

    base = _base_tokenizer(kind, lines)
    sp = Speller(base.to_str())
    counts, _ = count_words(sp, [lines])
    learned = learn(sp, counts, 150, set())
    tokens = [t for t, _, _ in learned]
    assert len(tokens) == 150 and len(set(tokens)) == 150
    assert not set(tokens) & set(sp.vocab)  # none re-spells a token the checkpoint has
    assert sp.specials >= {"<mask>"} or sp.specials >= {"[MASK]"}
    assert not [t for t in tokens if any(s in t or s in sp.shown(t) for s in sp.specials)]  # nor holds one
    data = json.loads(base.to_str())
    first = base.get_vocab_size(with_added_tokens=True)
    ids = install(data, sp, [(t, [a, b]) for t, a, b in learned], first)
    assert sorted(ids.values()) == list(range(first, first + 150))
    extended = Tokenizer.from_str(json.dumps(data))
    for token, i in base.get_vocab(with_added_tokens=True).items():  # old ids never move
        assert extended.token_to_id(token) == i
    # On text: the words the new tokens came from now encode with them (the pre-tokenizer's
    # word-start marker, Ġ / ▁ / no ##, is part of each token's spelling).
    sample = lines[:400]
    new_ids = {i for e in extended.encode_batch(sample) for i in e.ids if i >= first}
    assert len(new_ids) >= 100, f"{kind}: only {len(new_ids)} of 150 new tokens used on the text they came from"
    assert sum(map(len, (e.ids for e in extended.encode_batch(sample)))) < \
        sum(map(len, (e.ids for e in base.encode_batch(sample))))
    # transformers loads it as users do, to the same ids
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=extended)
    fast.save_pretrained(str(tmp_path / "tok"))
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert auto(sample[0], add_special_tokens=False)["input_ids"] == extended.encode(sample[0],
                                                                                   add_special_tokens=False).ids


def test_a_users_words_get_the_word_start_spelling_of_each_kind(lines):
    from tpu_ray.prepare.vocabulary import Speller, word_spelling

    spelled = {kind: word_spelling(Speller(_base_tokenizer(kind, lines).to_str()), "hemoglobin")
               for kind in ("unigram", "bytelevel", "wordpiece")}
    assert spelled == {"unigram": "\u2581hemoglobin", "bytelevel": "\u0120hemoglobin", "wordpiece": "hemoglobin"}
    wp = Speller(_base_tokenizer("wordpiece", lines).to_str())
    assert word_spelling(wp, "##globin") == "##globin" and word_spelling(wp, "two words") is None


@pytest.mark.parametrize("kind", ["unigram", "bpe", "bytelevel", "wordpiece"])
def test_a_users_word_encodes_as_one_new_token_in_text(lines, kind):
    """A word of many pieces from add_tokens_file: BPE gets the merges (and intermediates) that
    build it, WordPiece and Unigram one entry; in a sentence the word is then one token."""
    from tokenizers import Tokenizer

    from tpu_ray.prepare.vocabulary import Speller, install, word_spelling

    base = _base_tokenizer(kind, lines)
    sp = Speller(base.to_str())
    spelled = word_spelling(sp, "hemoglobin")
    assert len(sp.pieces(spelled)) > 2
    data = json.loads(base.to_str())
    first = base.get_vocab_size(with_added_tokens=True)
    ids = install(data, sp, [(spelled, [p for p, _ in sp.pieces(spelled)])], first)
    extended = Tokenizer.from_str(json.dumps(data))
    assert spelled in extended.encode("the hemoglobin of blood", add_special_tokens=False).tokens
    assert ids[spelled] == max(ids.values()) and (kind in ("bpe", "bytelevel")) == (len(ids) > 1)


# --- a continued run, end to end ------------------------------------------------------------------
@pytest.fixture(scope="module")
def source(tiny_roberta_run) -> Path:
    """A tpu-ray run (roberta, tiny, Unigram 800) trained a few steps: the checkpoint to extend
    (conftest.py's, shared with tests/test_init_from.py)."""
    return tiny_roberta_run


def _extended_cfg(tmp: Path, corpus: Path, source: Path, **over):
    return tiny_config(tmp / "ext", corpus, **{"model.init_from": str(source / "model"), "model.dropout": 0.0,
                                               "train.steps": 2, "train.checkpoint_every": 2, "train.eval_every": 2,
                                               "train.warmup_steps": 1, **over})


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_an_extended_run_uses_reports_exports_and_resumes(source, tmp_path, small_corpus):
    from tokenizers import Tokenizer

    from tests.helpers import manifest_json, shard_files
    from tests.test_train import _records
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.train.export import fill_mask

    words = tmp_path / "words.txt"
    words.write_text("hemoglobin\n\nphotosynthesis\n")
    cfg = _extended_cfg(tmp_path, small_corpus, source, **{"tokenizer.extend_tokens": 30,
                                                           "tokenizer.add_tokens_file": str(words)})
    p = Pipeline(cfg)
    p.run()
    run = Path(p.cfg.run_dir)
    summary = json.loads((run / "summary.json").read_text())["tokenizer"]
    assert summary["base_vocab_size"] == 800 and summary["vocab_size"] == 832 and summary["added_tokens"] == 32
    assert summary["added_tokens_origin"] == {"file": 2, "learned": 30}
    assert summary["tokens_per_word_after"] < summary["tokens_per_word_before"]
    # the shards were cut with the extended tokenizer, and use its new ids
    assert manifest_json(p.cfg.shards_dir)["tokenizer_sha256"] == summary["sha256"]
    import tensorflow as tf

    feature = {"input_ids": tf.io.FixedLenFeature([64], tf.int64)}
    files = [f for f, _ in shard_files(p.cfg.shards_dir, "train")]
    ids = [int(i) for rec in tf.data.TFRecordDataset(files).take(200)
           for i in tf.io.parse_single_example(rec, feature)["input_ids"].numpy()]
    assert sum(i >= 800 for i in ids) > 0.05 * len(ids)
    card = (run / "model" / "README.md").read_text()
    assert "the checkpoint's 800 tokens + 32 added (30 learned on the corpus" in card and "2 from `" in card
    record = json.loads((run / "model" / "vocabulary_extension.json").read_text())
    assert [t["text"] for t in record["tokens"][:2]] == ["hemoglobin", "photosynthesis"]
    exported = Tokenizer.from_file(str(run / "model" / "tokenizer.json"))
    ids = exported.encode("the hemoglobin of photosynthesis", add_special_tokens=False).ids
    assert ids[1] == 800 and ids[3] == 801  # each a word of its own, as a word after a space is spelled
    preds = fill_mask(str(run / "model"), "The [MASK] of the river.", top_k=832)
    assert {"hemoglobin", "photosynthesis"} <= {p["token_str"].strip() for p in preds}  # new tokens are answers
    # resume: the grown model is the run's own; its checkpoint restores, init_from is not read again
    more = cfg.override({"train.steps": 4, "train.extend_schedule": True})
    resumed = Pipeline(more).train(resume=True)
    assert resumed["resumed_from"] == 2 and resumed["steps"] == 4
    assert len([r for r in _records(run, "event") if r["event"] == "init_from"]) == 1


def test_the_check_accepts_exactly_the_recorded_growth(source, tmp_path, small_corpus):
    """The run's tokenizer with one token more than its record (or one moved) is refused, in one line."""
    from tpu_ray.pipeline import Pipeline

    cfg = _extended_cfg(tmp_path, small_corpus, source, **{"tokenizer.extend_tokens": 10})
    p = Pipeline(cfg)
    assert p.tokenizer().vocab_size == 810
    path = Path(p.cfg.tokenizer_dir) / "tokenizer.json"
    data = json.loads(path.read_text())
    data["model"]["vocab"].append(["\u2581sneaked", -5.0])
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"not the checkpoint's vocabulary plus the recorded tokens") as err:
        Pipeline(cfg).tokenizer()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("content, why", [
    ("hemoglobin\nhemoglobin\n", "line 2: 'hemoglobin' duplicates line 1"),
    ("hemoglobin\n<mask>\n", "line 2: '<mask>' is (or holds) a special token"),
    (None, "no such file"),
])
def test_a_bad_tokens_file_is_one_line(source, tmp_path, small_corpus, content, why):
    from tpu_ray.pipeline import Pipeline

    path = tmp_path / "tokens.txt"
    if content is not None:
        path.write_text(content)
    cfg = _extended_cfg(tmp_path, small_corpus, source, **{"tokenizer.add_tokens_file": str(path)})
    with pytest.raises(UserError) as err:
        Pipeline(cfg).tokenizer()
    msg = str(err.value)
    assert msg.startswith(f"tokenizer.add_tokens_file={path}") and why in msg and "\n" not in msg
    assert not (tmp_path / "ext" / "tokenizer" / "tokenizer.json").exists()  # nothing half-made


@pytest.mark.parametrize("args, why", [
    (["tokenizer.extend_tokens=0"], "tokenizer.extend_tokens=0: Input should be greater than or equal to 1"),
    (["tokenizer.extend_tokens=-3"], "tokenizer.extend_tokens=-3: Input should be greater than or equal to 1"),
    (["tokenizer.extend_tokens=100"], "extends a checkpoint's vocabulary: set model.init_from"),
    (["tokenizer.add_tokens_file=words.txt"], "extends a checkpoint's vocabulary: set model.init_from"),
])
@pytest.mark.quick
def test_bad_extension_options_exit_2_in_one_line(tmp_path, small_corpus, args, why, capfd):
    """The CLI in this process (its exit code and everything written to the stderr file descriptor)."""
    from tpu_ray.cli import main

    capfd.readouterr()
    code = main(["tokenizer", "--output-dir", str(tmp_path / "r"), "--corpus", str(small_corpus), *args])
    stderr = capfd.readouterr().err
    assert code == 2, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and why in lines[0], stderr


def test_a_duplicate_in_the_tokens_file_exits_2_on_the_cli(source, tmp_path, small_corpus, capfd):
    """The CLI in this process (its exit code and everything written to the stderr file descriptor)."""
    from tpu_ray.cli import main

    path = tmp_path / "tokens.txt"
    path.write_text("enzyme\nEnzyme\nenzyme\n")
    capfd.readouterr()
    code = main(["tokenizer", "--output-dir", str(tmp_path / "r"), "--corpus", str(small_corpus),
                 f"model.init_from={source / 'model'}", f"tokenizer.add_tokens_file={path}"])
    stderr = capfd.readouterr().err
    assert code == 2, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "line 3: 'enzyme' duplicates line 1" in lines[0], stderr


@pytest.mark.quick
def test_a_tokens_file_with_a_bom_and_crlf_gives_the_words_as_written(lines, tmp_path):
    """Notepad's UTF-8 (a BOM, CRLF): the first word is `hemoglobin`, not a BOM-prefixed token no text holds."""
    from tpu_ray.prepare.vocabulary import Speller, file_tokens

    path = tmp_path / "tokens.txt"
    path.write_bytes("\ufeffhemoglobin\r\n \r\nphotosynthesis\r\n".encode())
    sp = Speller(_base_tokenizer("unigram", lines).to_str())
    assert file_tokens(str(path), sp) == [("hemoglobin", "\u2581hemoglobin"), ("photosynthesis", "\u2581photosynthesis")]


def test_a_changed_tokens_file_is_refused_not_silently_reused(source, tmp_path, small_corpus):
    """The run's tokenizer was extended from the file as it was; other words in it later are a change."""
    from tpu_ray.pipeline import Pipeline

    words = tmp_path / "words.txt"
    words.write_text("hemoglobin\n")
    cfg = _extended_cfg(tmp_path, small_corpus, source, **{"tokenizer.add_tokens_file": str(words)})
    assert Pipeline(cfg).tokenizer().vocab_size == 801
    assert Pipeline(cfg).tokenizer().vocab_size == 801  # the same file: the tokenizer is reused
    words.write_text("hemoglobin\nchlorophyll\n")
    with pytest.raises(UserError, match=r"add_tokens_file=.*the file has changed since") as err:
        Pipeline(cfg).tokenizer()
    assert "\n" not in str(err.value)
