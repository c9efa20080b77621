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
from tpu_ray.config import TokenizerConfig
from tpu_ray.families import CONVENTIONS, TPU_RAY_MIXED, SpecialTokens
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
    # The tokens of the five roles (cls, pad, sep, unk, mask): tpu-ray's mixed set for old runs,
    # the family's convention for tokenizers trained since, the checkpoint's own with init_from.
    special_tokens: tuple[str, ...] = TPU_RAY_MIXED.as_tuple()
    # Every other special token's id (reserved_ids: XLM's <special0-9>, added special tokens):
    # never masked, never a random replacement.
    reserved_ids: tuple[int, ...] = ()

    @property
    def tokens(self) -> SpecialTokens:
        return SpecialTokens(*self.special_tokens)

    @property
    def special_ids(self) -> list[int]:
        return sorted({self.cls_id, self.sep_id, self.pad_id, self.unk_id, self.mask_id})


def _show_progress() -> bool:
    """The trainer's progress bars on a terminal only: in a log or a job they are blank lines."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def build_untrained(kind: str, lowercase: bool, special: list[str] | None = None,
                    unk: str = TPU_RAY_MIXED.unk) -> tuple[Tokenizer, trainers.Trainer]:
    """A tokenizer model and its trainer for `kind`, with `special` tokens at ids 0.. in that order
    (a family's convention, families.training_order; tpu-ray's mixed set by default)."""
    norms = [normalizers.NFKC(), normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if lowercase:
        norms.append(normalizers.Lowercase())
    special = list(special or TPU_RAY_MIXED.as_tuple())
    if kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer: trainers.Trainer = trainers.UnigramTrainer(unk_token=unk, special_tokens=special,
                                                                  show_progress=_show_progress())
    elif kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=unk))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(special_tokens=special, show_progress=_show_progress())
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=unk))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(special_tokens=special, show_progress=_show_progress())
    else:  # config validation makes this unreachable
        raise UserError(f"tokenizer.kind={kind!r}: expected unigram, bpe or wordpiece")
    tok.normalizer = normalizers.Sequence(norms)
    return tok, trainer


# A trained vocabulary below this fraction of tokenizer.vocab_size gets a warning with the reason.
SMALL_VOCAB_FRACTION = 0.5


def train_tokenizer(batches: Iterable[list[str]], cfg: TokenizerConfig, tokens: SpecialTokens = TPU_RAY_MIXED,
                    order: list[str] | None = None) -> Tokenizer:
    """Train on `batches` with the special `tokens` of the model's family, at ids 0..4 in `order`."""
    cls, sep = tokens.cls, tokens.sep
    special = list(order or tokens.as_tuple())
    tok, trainer = build_untrained(cfg.kind, cfg.lowercase, special, tokens.unk)
    trainer.vocab_size = cfg.vocab_size
    seen = {"lines": 0, "chars": 0}

    def counted(batches: Iterable[list[str]]):
        for batch in batches:
            seen["lines"] += len(batch)
            seen["chars"] += sum(map(len, batch))
            yield batch

    if cfg.kind == "wordpiece":  # trained twice (deterministic_wordpiece says why): the text is kept
        text = list(counted(batches))
        tok.train_from_iterator(iter(text), trainer=trainer)
        tok = deterministic_wordpiece(tok, text, cfg, special, tokens.unk)
    else:
        tok.train_from_iterator(counted(batches), trainer=trainer)
    if cfg.kind == "unigram":
        tok = canonical_unigram(tok, len(special))
    got = tok.get_vocab_size(with_added_tokens=True)
    if got < cfg.vocab_size * SMALL_VOCAB_FRACTION:
        log.warning("tokenizer: vocabulary of %d, far below tokenizer.vocab_size=%d: the training text "
                    "(%d lines, %d characters) has too few distinct pieces; give more text or lower "
                    "tokenizer.vocab_size", got, cfg.vocab_size, seen["lines"], seen["chars"])
    cls_id, sep_id = tok.token_to_id(cls), tok.token_to_id(sep)
    # Single sentences become "[CLS] text [SEP]" when a user encodes with special tokens (fill-mask).
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}",
        special_tokens=[(cls, cls_id), (sep, sep_id)],
    )
    tok.add_special_tokens([mask_token(tokens.mask)])
    return tok


# Unigram scores are kept to 6 decimals (about float32's precision, what SentencePiece stores):
# below that they are the trainer's rounding noise, never a difference between two pieces.
SCORE_DECIMALS = 6
# The score step `tokenizers`' Unigram trainer adds between the characters it keeps without a
# score of their own (UnigramTrainer::finalize, min_score_penalty_delta).
_PENALTY_STEP = 0.0001


def canonical_unigram(tok: Tokenizer, n_special: int) -> Tokenizer:
    """The trained Unigram vocabulary made a function of the text alone: scores rounded to
    SCORE_DECIMALS, the characters the trainer scored below every piece re-scored in character
    order, and the pieces after the `n_special` special tokens ordered by (-score, piece).

    Why: `tokenizers`' Unigram trainer (0.22) walks the words in hash-map order (ahash, seeded anew
    in every process), so two processes training on the same text give different vocabularies:
    every EM step sums the words' expected counts in another order (scores differ in the last bits,
    and by 4e-11 where an expected count of exactly 1, 2, ... falls either side of the integer: the
    trainer's digamma approximation steps there), the characters it keeps without a score of their
    own get min, min+1e-4, ... in hash order, and equal scores keep that order (ids differ). No
    option or environment variable (threads included) pins the hash seed. Rounding keeps the scores
    to 1e-6 (segmentation unchanged but between alternatives within 1e-6 of each other): two
    processes write the same tokenizer.json unless one score's noise straddles a rounding step,
    about 1 training in 8,000 on WikiText-2 at 8,000 pieces (three scores off by 4e-11, the rest by
    under 1e-13). The lasting fix is upstream (the trainer sorting its words). The special tokens
    keep their ids 0..n_special-1.
    """
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    special, pieces = vocab[:n_special], vocab[n_special:]
    if not pieces:
        return tok
    # The trainer's finalize: each required character missing from the model gets min_score plus
    # a penalty grown by _PENALTY_STEP, in hash order. Found by rounded score: real single
    # characters sit at the minimum or within 1e-13 of it depending on the summation order, so an
    # exact comparison would put another set of characters on the ladder in each process.
    lowest = min(score for _, score in pieces)
    singles = {i for i, (piece, _) in enumerate(pieces) if len(piece) == 1}
    ladder: list[int] = []
    value, penalty = lowest, 0.0
    while found := [i for i in singles if round(pieces[i][1], SCORE_DECIMALS) == round(value, SCORE_DECIMALS)
                    and i not in ladder]:
        ladder += found
        penalty += _PENALTY_STEP
        value = lowest + penalty
    scores = sorted((round(pieces[i][1], SCORE_DECIMALS) for i in ladder), reverse=True)
    rescored = dict(zip(sorted(pieces[i][0] for i in ladder), scores))
    ordered = sorted(([piece, rescored.get(piece, round(score, SCORE_DECIMALS))] for piece, score in pieces),
                     key=lambda ps: (-ps[1], ps[0]))
    data["model"]["vocab"] = special + ordered
    return Tokenizer.from_str(json.dumps(data))


def deterministic_wordpiece(first: Tokenizer, text: list[list[str]], cfg: TokenizerConfig, special: list[str],
                            unk: str) -> Tokenizer:
    """WordPiece trained again on `text` with the continuation pieces ("##a", one per character)
    given ids in character order up front; laid out as special tokens, characters, continuation
    pieces, merges (in the order they were learnt).

    Why: `tokenizers`' WordPiece trainer (0.22; BPE with a "##" prefix) gives each "##a" its id as
    it meets it while walking the words in hash-map order (ahash, seeded anew in every process),
    and breaks ties between equally frequent merges by those ids: two processes learn other merges
    at the vocabulary's edge (WordPiece 8,000 on WikiText-2 valid: "##ua" and "Josh" in one,
    "##hu" and "Joshu" in the other). `first`, the first training, names the continuation pieces
    the text has; given to the trainer as special tokens they take ids in the order given (and
    count against vocab_size as before), then they are plain vocabulary again (not added tokens).
    The price: the sampled text is held in memory (tokenizer.train_bytes of it, as Python strings: up
    to 4 bytes a character for emoji, 2 for CJK) and trained on twice (measured on 24 MB: 5.4 s and
    135 MB peak, against 3.2 s and 107 MB for one training).
    BPE (no prefix, its alphabet sorted) needs none of this.
    """
    prefix = "##"
    continuing = sorted(t for t in first.get_vocab() if t.startswith(prefix) and len(t) == len(prefix) + 1)
    tok, trainer = build_untrained("wordpiece", cfg.lowercase, special + continuing, unk)
    trainer.vocab_size = cfg.vocab_size
    tok.train_from_iterator(iter(text), trainer=trainer)
    data = json.loads(tok.to_str())
    pinned = set(continuing)
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] not in pinned]
    vocab: dict[str, int] = data["model"]["vocab"]
    by_id = sorted(vocab, key=vocab.__getitem__)
    rest = by_id[len(special):]
    layout = (by_id[:len(special)] + [t for t in rest if len(t) == 1] + continuing
              + [t for t in rest if len(t) > 1 and t not in pinned])
    data["model"]["vocab"] = {t: i for i, t in enumerate(layout)}
    return Tokenizer.from_str(json.dumps(data))


def mask_token(mask: str = TPU_RAY_MIXED.mask) -> AddedToken:
    """[MASK] takes the space before it (lstrip), as RoBERTa's <mask> does.

    Why: in training a masked word's whole token, leading "▁" included, becomes [MASK]; without
    lstrip, "in [MASK] ." would encode as `▁in ▁ [MASK]` with a lone "▁" the model never sees
    before a mask, and fill-mask would answer that empty piece. Same for Unigram, BPE, WordPiece.
    """
    return AddedToken(mask, lstrip=True, rstrip=False, single_word=False, normalized=False, special=True)


def save_tokenizer(tok: Tokenizer, out_dir: str, model_max_length: int,
                   tokens: SpecialTokens = TPU_RAY_MIXED) -> TokenizerInfo:
    """Save as a transformers-loadable directory (written locally, then committed whole)."""
    from transformers import PreTrainedTokenizerFast

    t = tokens
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=t.cls, eos_token=t.sep, cls_token=t.cls, sep_token=t.sep,
        unk_token=t.unk, pad_token=t.pad, mask_token=mask_token(t.mask), model_max_length=model_max_length,
    )
    with tempfile.TemporaryDirectory() as tmp:
        fast.save_pretrained(tmp)
        # Replaced whole (a retrain under --force included); on gs:// tokenizer.json goes last: its
        # presence is what marks the directory as complete.
        storage.commit_dir(tmp, out_dir, last=TOKENIZER_FILE)
    return describe(storage.read_text(storage.join(out_dir, TOKENIZER_FILE)), out_dir, declared_roles(out_dir))


def load_tokenizer_json(tokenizer_dir: str) -> str:
    path = storage.join(tokenizer_dir, TOKENIZER_FILE)
    try:
        return storage.read_text(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no tokenizer here; train one (tpu-ray tokenizer) or fix tokenizer.path") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a tokenizer file ({first_line(exc)}); retrain it with "
                        f"`tpu-ray tokenizer --force` or fix tokenizer.path") from None


def describe(tokenizer_json: str, where: str, roles: dict[str, tuple[str, str]] | None = None) -> TokenizerInfo:
    """Hash and special-token ids; a one-line error if a special token is missing.

    `roles` (declared_roles: role -> (token, the file naming it)) are the tokenizer's own word on
    which token plays which role; without them (a bare tokenizer.json) the roles are guessed from
    the vocabulary, and a vocabulary that holds two conventions is refused rather than guessed."""
    try:
        tok = Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # tokenizers raises a bare Exception for JSON it cannot parse
        raise UserError(f"{storage.join(where, TOKENIZER_FILE)}: not a readable tokenizer ({first_line(exc)}); "
                        f"retrain it with `tpu-ray tokenizer --force` or fix tokenizer.path") from None
    if roles:
        for role, (token, source) in roles.items():
            if tok.token_to_id(token) is None:
                raise UserError(f"{storage.join(where, source)}: {role}_token {token!r} is not in the vocabulary of "
                                f"{TOKENIZER_FILE}; fix the file or use the tokenizer it belongs to")
        conv = SpecialTokens(**{role: token for role, (token, _) in roles.items()})
    else:
        conv = guess_convention(tok, where)
    ids = {role: tok.token_to_id(t) for role, t in conv.by_role().items()}
    return TokenizerInfo(
        sha256=hashlib.sha256(canonical_json(tokenizer_json)).hexdigest(),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        cls_id=ids["cls"], sep_id=ids["sep"], pad_id=ids["pad"], unk_id=ids["unk"], mask_id=ids["mask"],
        special_tokens=conv.as_tuple(), reserved_ids=tuple(reserved_ids(tokenizer_json)),
    )


def reserved_ids(tokenizer_json: str) -> list[int]:
    """Ids of every special token beyond the five roles: added tokens marked special, and XLM's
    `<special0>`..`<special9>` wherever they sit in the vocabulary. Masking never draws them as
    random replacements (nor masks them): they are not text."""
    import re

    data = json.loads(tokenizer_json)
    ids = {int(t["id"]) for t in data.get("added_tokens", []) if t.get("special") and "id" in t}
    vocab = (data.get("model") or {}).get("vocab") or {}
    pieces = vocab.items() if isinstance(vocab, dict) else ((p[0], i) for i, p in enumerate(vocab))
    ids |= {int(i) for piece, i in pieces if isinstance(piece, str) and re.fullmatch(r"<special\d+>", piece)}
    return sorted(ids)


def guess_convention(tok: Tokenizer, where: str) -> SpecialTokens:
    """The one convention whose five tokens a bare tokenizer.json holds; two of them (MPNet's
    vocabulary holds <s> <pad> </s> <unk> <mask> and [CLS] [SEP] [MASK]) is refused in one line."""
    full = [conv for conv in CONVENTIONS if all(tok.token_to_id(t) is not None for t in conv.as_tuple())]
    if len(full) > 1:
        a, b = (" ".join(c.as_tuple()) for c in full[:2])
        raise UserError(f"{where}: the vocabulary holds two special-token conventions ({a}) and ({b}), and no "
                        f"tokenizer_config.json or special_tokens_map.json says which one it uses; add one naming "
                        f"cls_token, pad_token, sep_token, unk_token and mask_token")
    conv, missing = find_convention(tok)
    if missing:
        raise UserError(f"{where}: tokenizer lacks special token(s) {' '.join(missing)}; "
                        f"retrain it with tpu-ray tokenizer or add them")
    return conv


# Where a saved tokenizer names its special tokens, in transformers' order of precedence (the map
# overrides the config), and the keys of each role (cls and sep fall back to bos and eos).
ROLE_FILES = ("special_tokens_map.json", "tokenizer_config.json")
_ROLE_KEYS = {"cls": ("cls_token", "bos_token"), "pad": ("pad_token",), "sep": ("sep_token", "eos_token"),
              "unk": ("unk_token",), "mask": ("mask_token",)}


def declared_roles(tokenizer_dir: str) -> dict[str, tuple[str, str]]:
    """role -> (token, file) as the tokenizer's own special_tokens_map.json / tokenizer_config.json
    name them; {} when neither names any role (a bare tokenizer.json: the roles are guessed)."""
    files: list[tuple[str, dict]] = []
    for name in ROLE_FILES:
        path = storage.join(tokenizer_dir, name)
        if not storage.exists(path):
            continue
        try:
            data = json.loads(storage.read_text(path))
        except (ValueError, UnicodeDecodeError, IsADirectoryError) as exc:
            raise UserError(f"{path}: damaged ({first_line(exc)}); retrain it with `tpu-ray tokenizer --force` or "
                            f"fix tokenizer.path") from None
        if isinstance(data, dict):
            files.append((name, data))
    roles: dict[str, tuple[str, str]] = {}
    for role, keys in _ROLE_KEYS.items():
        for key in keys:
            found = next(((t, name) for name, data in files if (t := _token_text(data.get(key)))), None)
            if found:
                roles[role] = found
                break
    if roles and len(roles) < len(_ROLE_KEYS):
        lacking = [f"{r}_token" for r in _ROLE_KEYS if r not in roles]
        raise UserError(f"{storage.join(tokenizer_dir, roles[next(iter(roles))][1])}: names no {' '.join(lacking)}; "
                        f"masked-LM training needs cls, pad, sep, unk and mask tokens: add them")
    return roles


def _token_text(value: object) -> str | None:
    """A special token as saved: a string, or an AddedToken's dict ({"content": ...})."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def find_convention(tok: Tokenizer) -> tuple[SpecialTokens, list[str]]:
    """The first special-token convention (families.CONVENTIONS: tpu-ray's mixed set first, so old
    runs read as before) whose five tokens the tokenizer has; else the closest one and what it lacks."""
    best: tuple[SpecialTokens, list[str]] | None = None
    for conv in CONVENTIONS:
        missing = [t for t in conv.as_tuple() if tok.token_to_id(t) is None]
        if not missing:
            return conv, []
        if best is None or len(missing) < len(best[1]):
            best = (conv, missing)
    assert best is not None
    return best


def canonical_json(text: str) -> bytes:
    """The tokenizer's content independent of whitespace/key order, for a stable hash."""
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":")).encode("utf-8")


def tokenizer_info(tokenizer_dir: str) -> TokenizerInfo:
    info = describe(load_tokenizer_json(tokenizer_dir), tokenizer_dir, declared_roles(tokenizer_dir))
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
