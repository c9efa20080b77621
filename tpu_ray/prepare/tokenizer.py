"""Train, save, hash and load the tokenizer.

Training uses Hugging Face `tokenizers` (Unigram by default, as the reference workflow does); the
result is saved as a directory `transformers.AutoTokenizer.from_pretrained` loads, so the exported
model and `pipeline("fill-mask")` use exactly the tokenizer the shards were made with. Sharding
workers load only `tokenizer.json` with `tokenizers`: no transformers, no TensorFlow there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tpu_ray import rundir, storage
from tpu_ray.config import CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK, TokenizerConfig
from tpu_ray.errors import UserError, first_line

log = logging.getLogger(__name__)
TOKENIZER_FILE = rundir.TOKENIZER_FILE


@dataclass(frozen=True)
class TokenizerInfo:
    """What later stages need to know about a tokenizer, without loading transformers."""

    sha256: str
    vocab_size: int
    cls_id: int
    sep_id: int
    pad_id: int
    unk_id: int
    mask_id: int

    @property
    def special_ids(self) -> list[int]:
        return sorted({self.cls_id, self.sep_id, self.pad_id, self.unk_id, self.mask_id})


def _show_progress() -> bool:
    """The trainer's progress bars on a terminal only: in a log or a job they are blank lines."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def build_untrained(kind: str, lowercase: bool) -> tuple[Tokenizer, trainers.Trainer]:
    """A tokenizer model and its trainer for `kind`, with the project's special tokens."""
    norms = [normalizers.NFKC(), normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if lowercase:
        norms.append(normalizers.Lowercase())
    special = list(SPECIAL_TOKENS)
    if kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer: trainers.Trainer = trainers.UnigramTrainer(unk_token=UNK, special_tokens=special,
                                                                  show_progress=_show_progress())
    elif kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(special_tokens=special, show_progress=_show_progress())
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(special_tokens=special, show_progress=_show_progress())
    else:  # config validation makes this unreachable
        raise UserError(f"tokenizer.kind={kind!r}: expected unigram, bpe or wordpiece")
    tok.normalizer = normalizers.Sequence(norms)
    return tok, trainer


# A trained vocabulary below this fraction of tokenizer.vocab_size gets a warning with the reason.
SMALL_VOCAB_FRACTION = 0.5


def train_tokenizer(batches: Iterable[list[str]], cfg: TokenizerConfig) -> Tokenizer:
    tok, trainer = build_untrained(cfg.kind, cfg.lowercase)
    trainer.vocab_size = cfg.vocab_size
    seen = {"lines": 0, "chars": 0}

    def counted(batches: Iterable[list[str]]):
        for batch in batches:
            seen["lines"] += len(batch)
            seen["chars"] += sum(map(len, batch))
            yield batch

    tok.train_from_iterator(counted(batches), trainer=trainer)
    got = tok.get_vocab_size(with_added_tokens=True)
    if got < cfg.vocab_size * SMALL_VOCAB_FRACTION:
        log.warning("tokenizer: vocabulary of %d, far below tokenizer.vocab_size=%d: the training text "
                    "(%d lines, %d characters) has too few distinct pieces; give more text or lower "
                    "tokenizer.vocab_size", got, cfg.vocab_size, seen["lines"], seen["chars"])
    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    # Single sentences become "[CLS] text [SEP]" when a user encodes with special tokens (fill-mask).
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}", pair=f"{CLS} $A {SEP} {SEP} $B {SEP}",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )
    tok.add_special_tokens([mask_token()])
    return tok


def mask_token() -> AddedToken:
    """[MASK] takes the space before it (lstrip), as RoBERTa's <mask> does.

    Why: in training a masked word's whole token, leading "▁" included, becomes [MASK]; without
    lstrip, "in [MASK] ." would encode as `▁in ▁ [MASK]` with a lone "▁" the model never sees
    before a mask, and fill-mask would answer that empty piece. Same for Unigram, BPE, WordPiece.
    """
    return AddedToken(MASK, lstrip=True, rstrip=False, single_word=False, normalized=False, special=True)


def save_tokenizer(tok: Tokenizer, out_dir: str, model_max_length: int) -> TokenizerInfo:
    """Save as a transformers-loadable directory (written locally, then committed file by file)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=CLS, eos_token=SEP, cls_token=CLS, sep_token=SEP,
        unk_token=UNK, pad_token=PAD, mask_token=mask_token(), model_max_length=model_max_length,
    )
    with tempfile.TemporaryDirectory() as tmp:
        fast.save_pretrained(tmp)
        storage.makedirs(out_dir)
        # tokenizer.json last: its presence is what marks the directory as complete.
        names = sorted(p.name for p in __import__("pathlib").Path(tmp).iterdir())
        for name in sorted(names, key=lambda n: n == TOKENIZER_FILE):
            storage.atomic_copy_file(f"{tmp}/{name}", storage.join(out_dir, name))
    return describe(storage.read_text(storage.join(out_dir, TOKENIZER_FILE)), out_dir)


def load_tokenizer_json(tokenizer_dir: str) -> str:
    path = storage.join(tokenizer_dir, TOKENIZER_FILE)
    try:
        return storage.read_text(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no tokenizer here; train one (tpu-ray tokenizer) or fix tokenizer.path") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a tokenizer file ({first_line(exc)}); retrain it with "
                        f"`tpu-ray tokenizer --force` or fix tokenizer.path") from None


def describe(tokenizer_json: str, where: str) -> TokenizerInfo:
    """Hash and special-token ids; a one-line error if a special token is missing."""
    try:
        tok = Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # tokenizers raises a bare Exception for JSON it cannot parse
        raise UserError(f"{storage.join(where, TOKENIZER_FILE)}: not a readable tokenizer ({first_line(exc)}); "
                        f"retrain it with `tpu-ray tokenizer --force` or fix tokenizer.path") from None
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise UserError(f"{where}: tokenizer lacks special token(s) {' '.join(missing)}; "
                        f"retrain it with tpu-ray tokenizer or add them")
    return TokenizerInfo(
        sha256=hashlib.sha256(canonical_json(tokenizer_json)).hexdigest(),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        cls_id=ids[CLS], sep_id=ids[SEP], pad_id=ids[PAD], unk_id=ids[UNK], mask_id=ids[MASK],
    )


def canonical_json(text: str) -> bytes:
    """The tokenizer's content independent of whitespace/key order, for a stable hash."""
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":")).encode("utf-8")


def tokenizer_info(tokenizer_dir: str) -> TokenizerInfo:
    info = describe(load_tokenizer_json(tokenizer_dir), tokenizer_dir)
    check_json_files(tokenizer_dir, "retrain it with `tpu-ray tokenizer --force` or fix tokenizer.path")
    return info


def check_json_files(directory: str, fix: str) -> None:
    """Every `*.json` of a saved tokenizer or model directory parses, else a one-line error naming it.

    Why: transformers loads some of these files leniently (a damaged special_tokens_map.json is
    skipped without a word), and damage must never be silent. A few small files: cheap.
    """
    for path in storage.listdir(directory):
        if not path.endswith(".json"):
            continue
        if storage.isdir(path):
            raise UserError(f"{path}: is a directory, not a JSON file; {fix}")
        try:
            json.loads(storage.read_text(path))
        except (ValueError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: damaged ({first_line(exc)}); {fix}") from None
