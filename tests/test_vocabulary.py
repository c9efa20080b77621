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


@pytest.fixture(scope="module")
def extended_run(source, tmp_path_factory, small_corpus):
    """(config, resumed training's summary) of a run extended by 30 learned tokens and a file of 2,
    trained 2 steps, then resumed to 4 (train.extend_schedule). Read only: what the run test checks,
    and the stable run a branch continues (one training for both)."""
    from tpu_ray.pipeline import Pipeline

    tmp = tmp_path_factory.mktemp("extended-run")
    words = tmp / "words.txt"
    words.write_text("hemoglobin\n\nphotosynthesis\n")
    cfg = _extended_cfg(tmp, small_corpus, source, **{"tokenizer.extend_tokens": 30,
                                                      "tokenizer.add_tokens_file": str(words)})
    p = Pipeline(cfg)
    p.run()
    # resume: the grown model is the run's own; its checkpoint restores, init_from is not read again
    resumed = Pipeline(cfg.override({"train.steps": 4, "train.extend_schedule": True})).train(resume=True)
    return p.cfg, resumed


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_an_extended_run_uses_reports_exports_and_resumes(extended_run):
    from tokenizers import Tokenizer

    from tests.helpers import manifest_json, shard_files
    from tests.test_train import _records
    from tpu_ray.train.export import fill_mask

    cfg, resumed = extended_run
    run = Path(cfg.run_dir)
    summary = json.loads((run / "summary.json").read_text())["tokenizer"]
    assert summary["base_vocab_size"] == 800 and summary["vocab_size"] == 832 and summary["added_tokens"] == 32
    assert summary["added_tokens_origin"] == {"file": 2, "learned": 30}
    assert summary["tokens_per_word_after"] < summary["tokens_per_word_before"]
    # the shards were cut with the extended tokenizer, and use its new ids
    assert manifest_json(cfg.shards_dir)["tokenizer_sha256"] == summary["sha256"]
    import tensorflow as tf

    feature = {"input_ids": tf.io.FixedLenFeature([64], tf.int64)}
    files = [f for f, _ in shard_files(cfg.shards_dir, "train")]
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
    # resumed (extended_run): the grown model is the run's own; its checkpoint restores, init_from is not read again
    assert resumed["resumed_from"] == 2 and resumed["steps"] == 4
    assert len([r for r in _records(run, "event") if r["event"] == "init_from"]) == 1


@pytest.mark.slow  # extended_run's training (shared with the test above), then ~10 s of its own
def test_a_branch_of_an_extended_run_continues_it_on_its_tokenizer_and_resumes(extended_run, tmp_path):
    """extended_run's own config.yaml with train.branch_from (its extension kept, as a copied config
    has it), branched at step 2: it reads the stable run's tokenizer (nothing learned or added again),
    continues the stable run's steps 3-4 exactly, records what it read, resumes, and leaves the stable
    run as it was (its copy of model.init_from included, which a branch once moved away)."""
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.saved_config import read_saved_config

    cfg, resumed = extended_run
    stable = Path(cfg.run_dir)
    files = lambda: {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in stable.rglob("*") if p.is_file()}  # noqa: E731
    before = files()
    branch = read_saved_config(str(stable)).override({"output_dir": str(tmp_path / "branch"),
                                                      "train.branch_from": str(stable / "checkpoints" / "ckpt-2")})
    assert branch.tokenizer.extend_tokens == 30 and branch.train.steps == 4
    summary = Pipeline(branch).train()
    assert summary["resumed_from"] == 2 and summary["steps"] == 4
    # the same tokens, weights, optimizer state and data position: the stable run's step 4, exactly
    for key in ("final_loss", "eval_loss"):
        assert summary[key] == pytest.approx(resumed[key], rel=1e-5), key
    saved = read_saved_config(str(tmp_path / "branch"))
    assert (saved.tokenizer.path, saved.tokenizer.extend_tokens, saved.tokenizer.add_tokens_file) == \
        (str(stable / "tokenizer"), None, None)
    assert not (tmp_path / "branch" / "tokenizer").exists()
    assert Pipeline(branch).train(resume=True)["resumed_from"] == 4  # its own checkpoint, the copied config again
    assert files() == before


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


# --- a branch of an extended run (train.branch_from) ----------------------------------------------
def _branchable(run: Path, step: int = 4) -> None:
    """`run` as a branch finds it before loading anything: its shards/ and a committed ckpt-N's name (no
    weights: every check here comes before a restore)."""
    (run / "shards").mkdir(exist_ok=True)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\n')
    (run / "checkpoints" / f"ckpt-{step}.index").write_bytes(b"")


def _stable(source: Path, tmp: Path, corpus: Path, **over) -> Path:
    """A continued run at a constant rate as a branch finds it: its config.yaml and tokenizer (the
    tokenizer stage's, extending the vocabulary as `over` asks)."""
    from tpu_ray.pipeline import Pipeline

    cfg = _extended_cfg(tmp, corpus, source, **{"train.schedule": "constant", "train.steps": 12, **over})
    Pipeline(cfg).tokenizer()
    _branchable(tmp / "ext")
    return tmp / "ext"


def _copied_branch(stable: Path, out: Path, **over):
    """The stable run's own config.yaml with train.branch_from added, as a user copies it (its extension kept)."""
    from tpu_ray.saved_config import read_saved_config

    return read_saved_config(str(stable)).override({"output_dir": str(out), "train.branch_from": str(stable),
                                                    "train.schedule": "wsd", **over})


@pytest.fixture(scope="module")
def extended_stable(source, tmp_path_factory, small_corpus) -> tuple[Path, Path]:
    """(a run extended by tokenizer.extend_tokens=10 and a file of two words, as a branch finds it; the file)."""
    tmp = tmp_path_factory.mktemp("extended-stable")
    words = tmp / "words.txt"
    words.write_text("hemoglobin\nphotosynthesis\n")
    return _stable(source, tmp, small_corpus, **{"tokenizer.extend_tokens": 10,
                                                 "tokenizer.add_tokens_file": str(words)}), words


def test_a_branch_naming_the_stable_runs_extension_reads_its_tokenizer_as_it_is(extended_stable, tmp_path):
    """The stable run's config copied with train.branch_from was refused ("tokenizer.extend_tokens and
    tokenizer.path both"): the branch reads the stable run's extended tokenizer (learns and adds nothing
    again), its config says so, and its resumed start does too."""
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.saved_config import save_config

    stable, words = extended_stable
    branch = _copied_branch(stable, tmp_path / "branch")
    assert (branch.tokenizer.extend_tokens, branch.tokenizer.add_tokens_file) == (10, str(words))
    got = Pipeline(branch).cfg
    assert (got.tokenizer_dir, got.tokenizer.extend_tokens, got.tokenizer.add_tokens_file) == \
        (str(stable / "tokenizer"), None, None)
    assert Pipeline(branch.override({"tokenizer.extend_tokens": None, "tokenizer.add_tokens_file": None})).cfg == got
    # resumed (its own config.yaml and checkpoints): the same tokenizer, the extension still checked
    save_config(got, False, {})
    (tmp_path / "branch" / "checkpoints").mkdir()
    (tmp_path / "branch" / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-6"\n')
    assert Pipeline(branch).cfg.tokenizer == got.tokenizer
    with pytest.raises(UserError, match=r"^tokenizer.extend_tokens=20: not the extension of the stable run"):
        Pipeline(branch.override({"tokenizer.extend_tokens": 20}))


@pytest.mark.parametrize("case, needle", [
    ("count", "tokenizer.extend_tokens=20: not the extension of the stable run this branch continues ({stable}: "
              "tokenizer.extend_tokens=10 tokenizer.add_tokens_file={words}, in {stable}/tokenizer/"
              "vocabulary_extension.json); a branch reads that tokenizer as it is: set tokenizer.extend_tokens=10"),
    ("file", "tokenizer.add_tokens_file={other}: not the extension of the stable run this branch continues"),
    ("no file", "tokenizer.add_tokens_file=null: not the extension of the stable run this branch continues"),
    ("content", "tokenizer.add_tokens_file={words}: holds other tokens than when the stable run's tokenizer was "
                "extended from it"),
    ("not extended", "tokenizer.extend_tokens=10: the stable run this branch continues ({stable}) did not extend "
                     "its vocabulary"),
])
def test_a_branch_naming_another_extension_exits_2_in_one_line_before_anything(
        extended_stable, source, small_corpus, tmp_path, case, needle, capfd):
    """Another count, another file, the file's other content, or an extension of a run that made none:
    one line naming the field and what differs, exit 2, before any stage or cluster (the CLI in this process)."""
    from tpu_ray.cli import main

    stable, words = extended_stable
    other = tmp_path / "other.txt"
    other.write_text("hemoglobin\nchlorophyll\n")
    over = {"count": {"tokenizer.extend_tokens": 20}, "file": {"tokenizer.add_tokens_file": str(other)},
            "no file": {"tokenizer.add_tokens_file": None}}.get(case, {})
    if case == "not extended":
        stable = _stable(source, tmp_path / "plain", small_corpus)
        over = {"tokenizer.extend_tokens": 10}
    (tmp_path / "branch.yaml").write_text(_copied_branch(stable, tmp_path / "branch", **over).to_yaml())
    kept = words.read_text()
    if case == "content":
        words.write_text(kept + "chlorophyll\n")
    capfd.readouterr()
    try:
        code = main(["train", "--config", str(tmp_path / "branch.yaml"), "ray.address=local"])
    finally:
        words.write_text(kept)
    stderr = capfd.readouterr().err
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, stderr
    assert needle.format(stable=stable, words=words, other=other) in lines[0], lines[0]
    assert "tokenizer.extend_tokens" in lines[0] and not (tmp_path / "branch").exists()
