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
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tpu_ray import storage
from tpu_ray.config import CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK, TokenizerConfig
from tpu_ray.errors import UserError

log = logging.getLogger(__name__)
TOKENIZER_FILE = "tokenizer.json"


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
        trainer: trainers.Trainer = trainers.UnigramTrainer(unk_token=UNK, special_tokens=special)
    elif kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(special_tokens=special)
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(special_tokens=special)
    else:  # config validation makes this unreachable
        raise UserError(f"tokenizer.kind={kind!r}: expected unigram, bpe or wordpiece")
    tok.normalizer = normalizers.Sequence(norms)
    return tok, trainer


def train_tokenizer(batches: Iterable[list[str]], cfg: TokenizerConfig) -> Tokenizer:
    tok, trainer = build_untrained(cfg.kind, cfg.lowercase)
    trainer.vocab_size = cfg.vocab_size
    tok.train_from_iterator(batches, trainer=trainer)
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


def describe(tokenizer_json: str, where: str) -> TokenizerInfo:
    """Hash and special-token ids; a one-line error if a special token is missing."""
    tok = Tokenizer.from_str(tokenizer_json)
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
    return describe(load_tokenizer_json(tokenizer_dir), tokenizer_dir)
