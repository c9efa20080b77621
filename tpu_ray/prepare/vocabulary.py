"""Domain vocabulary: extend a checkpoint's tokenizer with the corpus's own tokens.

`tokenizer.extend_tokens=N` learns, on the run's corpus sample (all sources, by weight), the N
tokens that save the most pieces under the checkpoint's tokenizer: greedily, the adjacent pair of
pieces that occurs most often (counted over words, by frequency) becomes one token, as BPE training
would continue from the checkpoint's segmentation. Whole words and frequent word pieces both come
out of it. `tokenizer.add_tokens_file=PATH` adds a user's own tokens (one word a line; `##piece`
for a WordPiece continuation) before the learned ones.

Why in the tokenizer's model and not as `added_tokens`: an added token is matched on the raw text
before pre-tokenization, so RoBERTa's " word" becomes `Ġ` + `word` (a lone space token) and a piece
inside a word is split out wherever it occurs. Here each token is written in the model's own
spelling (`Ġword`, `▁word`, `word` / `##piece`) and installed the way that kind of model produces
tokens: BPE gets a merge ranked after all of the checkpoint's (its old merges run first, so old text
segments as before until the new merges apply); WordPiece a vocabulary entry (longest match first);
Unigram a piece scored just above the segmentation it replaces. So the tokens are ordinary
vocabulary: the shards use them, `AutoTokenizer` loads them, fill-mask can predict them.

New tokens take ids after the checkpoint's (old ids never move); RUN/tokenizer/vocabulary_extension.json
records each token, its origin and the checkpoint's pieces its embedding row starts from
(train/grow.py), and init_from's vocabulary check accepts exactly that growth.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from tpu_ray import storage
from tpu_ray.config import TokenizerConfig
from tpu_ray.errors import UserError

log = logging.getLogger(__name__)

EXTENSION_FILE = "vocabulary_extension.json"
# Files of a slow tokenizer that would still hold the checkpoint's vocabulary: an extended
# tokenizer is tokenizer.json alone (transformers' fast tokenizers load it without them).
SLOW_FILES = ("vocab.txt", "vocab.json", "merges.txt", "sentencepiece.bpe.model", "spiece.model", "spm.model",
              "added_tokens.json")
UNK = "\x00unk"  # an unknown piece in a word's segmentation: never part of a new token
UNIGRAM_MARGIN = 1.0  # a new Unigram piece scores this much above the pieces it replaces
MIN_COUNT = 2  # a learned token must save at least this many pieces on the sample
MAX_WORDS = 300_000  # distinct words the learner keeps (the most frequent)


@dataclass(frozen=True)
class NewToken:
    token: str  # in the model's own spelling (Ġword, ▁word, ##piece)
    id: int
    origin: str  # "file" or "learned"
    pieces: tuple[int, ...]  # the checkpoint tokenizer's split of it: its embedding row's mean


class Speller:
    """A tokenizer.json seen as its model: the words of a text, the pieces of a word, and how two
    pieces join (WordPiece and prefixed BPE drop the continuation prefix of the second)."""

    def __init__(self, tokenizer_json: str):
        self.json = tokenizer_json
        self.data = json.loads(tokenizer_json)
        self.tok = Tokenizer.from_str(tokenizer_json)
        self.kind = (self.data.get("model") or {}).get("type")
        self.prefix = (self.data["model"].get("continuing_subword_prefix") or "") if self.kind in ("BPE", "WordPiece") \
            else ""
        self.vocab = self.tok.get_vocab(with_added_tokens=True)
        unk = self.data["model"].get("unk_token") if self.kind != "Unigram" else None
        self.unk_id = self.vocab.get(unk) if unk else self.data["model"].get("unk_id")
        self.specials = {t["content"] for t in self.data.get("added_tokens", []) if t.get("special")}

    def words(self, line: str) -> list[str]:
        """The pre-tokenized words of `line`, normalized, in the model's spelling."""
        text = self.tok.normalizer.normalize_str(line) if self.tok.normalizer else line
        if self.tok.pre_tokenizer is None:
            return text.split()
        return [w for w, _ in self.tok.pre_tokenizer.pre_tokenize_str(text)]

    def pieces(self, word: str) -> list[tuple[str, int]]:
        """(piece, id) of `word` under the model (unknown pieces as UNK)."""
        return [(UNK if t.id == self.unk_id else t.value, t.id) for t in self.tok.model.tokenize(word)]

    def join(self, a: str, b: str) -> str:
        return a + (b[len(self.prefix):] if self.prefix and b.startswith(self.prefix) else b)

    def shown(self, token: str) -> str:
        """The token as text (a word-start marker read as a space), for messages and specials."""
        if self.tok.decoder is not None:
            try:
                return self.tok.decoder.decode([token]).strip()
            except Exception:  # a decoder that cannot take a lone piece: the spelling itself
                pass
        return token.strip()


def word_spelling(sp: Speller, text: str) -> str | None:
    """A user's token as the model spells it: `##x` stays a WordPiece continuation; a word is
    spelled as it is mid-sentence (after a space: `Ġword`, `▁word`); None if it is not one word."""
    if sp.kind == "WordPiece" and text.startswith(sp.prefix) and len(text) > len(sp.prefix):
        inner = sp.words(text[len(sp.prefix):])
        return sp.prefix + inner[0] if len(inner) == 1 else None
    words = sp.words(f"a {text}")
    return words[1] if len(words) == 2 else None


def file_tokens(path: str, sp: Speller) -> list[tuple[str, str]]:
    """(as written, model spelling) of each line of `path`; one line for what is wrong with it."""
    try:
        # A BOM (Notepad's UTF-8) would be part of the first token: a token no text ever holds.
        lines = storage.read_text(path).removeprefix("\ufeff").splitlines()
    except FileNotFoundError:
        raise UserError(f"tokenizer.add_tokens_file={path}: no such file; give a text file of tokens, one a "
                        f"line") from None
    except (IsADirectoryError, UnicodeDecodeError, OSError) as exc:
        raise UserError(f"tokenizer.add_tokens_file={path}: not a UTF-8 text file ({type(exc).__name__}); give a "
                        f"text file of tokens, one a line") from None
    out: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text:
            continue
        where = f"tokenizer.add_tokens_file={path}: line {n}"
        if text in sp.specials or any(s in text for s in sp.specials):
            raise UserError(f"{where}: {text!r} is (or holds) a special token of the checkpoint's tokenizer; "
                            f"remove it (special tokens are never vocabulary to learn)")
        spelled = word_spelling(sp, text)
        if spelled is None:
            raise UserError(f"{where}: {text!r} is more than one word to this tokenizer "
                            f"({' '.join(sp.words(text))}); give one word (or ##piece for WordPiece) a line")
        if spelled in seen:
            raise UserError(f"{where}: {text!r} duplicates line {seen[spelled]}; keep one")
        if spelled in sp.vocab:
            raise UserError(f"{where}: {text!r} is already in the checkpoint's vocabulary ({spelled!r}, id "
                            f"{sp.vocab[spelled]}); remove it")
        seen[spelled] = n
        out.append((text, spelled))
    if not out:
        raise UserError(f"tokenizer.add_tokens_file={path}: holds no token; give one a line")
    return out


def count_words(sp: Speller, batches: Iterable[list[str]]) -> tuple[Counter, int]:
    """Word frequencies of the sample (model spelling) and its whitespace-separated word count."""
    counts: Counter = Counter()
    words = 0
    for batch in batches:
        for line in batch:
            words += len(line.split())
            counts.update(sp.words(line))
    return counts, words


def tokens_per_word(tok: Tokenizer, batches: Iterable[list[str]]) -> float:
    """Pieces per whitespace-separated word of the text, special tokens not counted."""
    pieces = words = 0
    for batch in batches:
        words += sum(len(line.split()) for line in batch)
        pieces += sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False))
    return pieces / words if words else float("nan")


def learn(sp: Speller, counts: Counter, n: int, taken: set[str]) -> list[tuple[str, str, str]]:
    """The `n` tokens (token, left, right) that save the most pieces: greedy pair merges over the
    words' current segmentation, each pair weighted by its words' frequency. Never a string already
    in the vocabulary or `taken`, never one holding a special token or an unknown piece."""
    common = [(w, c) for w, c in counts.most_common(MAX_WORDS) if c >= 1]
    seqs = [[p for p, _ in sp.pieces(w)] for w, _ in common]
    freq = [c for _, c in common]
    pairs: Counter = Counter()
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, seq in enumerate(seqs):
        for pair in zip(seq, seq[1:]):
            pairs[pair] += freq[i]
            where[pair].add(i)
    heap = [(-c, a, b) for (a, b), c in pairs.items()]
    heapq.heapify(heap)
    banned: set[tuple[str, str]] = set()
    out: list[tuple[str, str, str]] = []
    while heap and len(out) < n:
        neg, a, b = heapq.heappop(heap)
        count = pairs.get((a, b), 0)
        if count != -neg:  # stale entry: its count changed since it was pushed
            if count > 0:
                heapq.heappush(heap, (-count, a, b))
            continue
        if count < MIN_COUNT:
            break
        merged = sp.join(a, b)
        if UNK in (a, b) or merged in sp.vocab or merged in taken or _holds_special(sp, merged):
            banned.add((a, b))
            pairs.pop((a, b), None)
            continue
        out.append((merged, a, b))
        taken.add(merged)
        for i in sorted(where.pop((a, b), ())):
            seq = seqs[i]
            for pair in zip(seq, seq[1:]):
                pairs[pair] -= freq[i]
            seq[:] = _merge(seq, a, b, merged)
            for pair in zip(seq, seq[1:]):
                if pair in banned:
                    continue
                pairs[pair] += freq[i]
                where[pair].add(i)
                heapq.heappush(heap, (-pairs[pair], *pair))
        pairs.pop((a, b), None)
    return out


def _merge(seq: list[str], a: str, b: str, merged: str) -> list[str]:
    out, i = [], 0
    while i < len(seq):
        if i + 1 < len(seq) and seq[i] == a and seq[i + 1] == b:
            out.append(merged)
            i += 2
        else:
            out.append(seq[i])
            i += 1
    return out


def _holds_special(sp: Speller, token: str) -> bool:
    shown = sp.shown(token)
    return any(s in token or s in shown for s in sp.specials) or shown in sp.specials


def install(data: dict[str, Any], sp: Speller, tokens: list[tuple[str, list[str]]], first_id: int) -> dict[str, int]:
    """Write `tokens` (token, the pieces it joins, left to right) into the tokenizer's model at ids
    first_id.. ; returns token -> id. A BPE token of more than two pieces gets chained merges whose
    intermediate strings must be tokens too: they are added (and returned) before it."""
    model = data["model"]
    ids: dict[str, int] = {}
    added = {t["id"]: t["content"] for t in data.get("added_tokens", [])}
    # An added token past the model's own vocabulary (a <mask> added after training) is given its
    # id again when the file is loaded: the model's size at that moment, which would be a new
    # token's. So it joins the model's vocabulary at its id first (never produced from text: the
    # added tokens are matched before the model runs; a Unigram piece scored far below any other).
    if sp.kind == "Unigram":
        vocab = model["vocab"]
        scores = {p: s for p, s in vocab}
        low = min((s for _, s in vocab), default=0.0) - 100.0
        while len(vocab) < first_id:
            if len(vocab) not in added:
                raise UserError(f"the checkpoint's tokenizer has no token with id {len(vocab)} below its size "
                                f"{first_id}; its vocabulary cannot be extended")
            vocab.append([added[len(vocab)], low])
            scores[vocab[-1][0]] = low
        for token, parts in tokens:
            score = sum(scores[p] for p in parts)  # the path it replaces (its parts are pieces already)
            replaced = sum(scores.get(p, low) for p, _ in sp.pieces(token))  # the model's own best for it
            scores[token] = max(score, replaced) + UNIGRAM_MARGIN
            ids[token] = len(vocab)
            vocab.append([token, scores[token]])
        return ids
    vocab = model["vocab"]
    held = set(vocab.values())
    for i in range(first_id):
        if i not in held:
            if i not in added:
                raise UserError(f"the checkpoint's tokenizer has no token with id {i} below its size {first_id}; "
                                f"its vocabulary cannot be extended")
            vocab[added[i]] = i
    next_id = first_id
    if sp.kind == "WordPiece":
        for token, _ in tokens:
            vocab[token] = ids[token] = next_id
            next_id += 1
        return ids
    if sp.kind != "BPE":
        raise UserError(f"the checkpoint's tokenizer is a {sp.kind} model; tokenizer.extend_tokens and "
                        f"tokenizer.add_tokens_file extend BPE, WordPiece and Unigram tokenizers")
    merges = model["merges"]
    as_text = bool(merges) and isinstance(merges[0], str)
    for token, parts in tokens:
        joined = parts[0]
        for left, right in merge_plan(sp, parts, vocab):  # children before parents: each merge finds its pieces
            joined = sp.join(left, right)
            if joined not in vocab:
                vocab[joined] = ids[joined] = next_id
                next_id += 1
            merges.append(f"{left} {right}" if as_text else [left, right])
        assert joined == token, (joined, token)
    return ids


def merge_plan(sp: Speller, parts: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The BPE merges that join `parts` into one token, children first, through as few strings the
    vocabulary lacks as a split allows (a span already a token costs nothing; every other span
    but the whole is an intermediate token to add)."""
    n = len(parts)
    spans = {(i, i + 1): parts[i] for i in range(n)}
    for width in range(2, n + 1):
        for i in range(n - width + 1):
            spans[(i, i + width)] = sp.join(spans[(i, i + 1)], spans[(i + 1, i + width)]) if width == 2 else \
                sp.join(spans[(i, i + width - 1)], parts[i + width - 1])
    best: dict[tuple[int, int], tuple[int, int | None]] = {(i, i + 1): (0, None) for i in range(n)}
    for width in range(2, n + 1):
        for i in range(n - width + 1):
            k = i + width
            own = 0 if (spans[(i, k)] in vocab or width == n) else 1
            cost, j = min((best[(i, j)][0] + best[(j, k)][0], j) for j in range(i + 1, k))
            best[(i, k)] = (cost + own, j)
    plan: list[tuple[str, str]] = []

    def walk(i: int, k: int) -> None:
        j = best[(i, k)][1]
        if j is None:
            return
        walk(i, j)
        walk(j, k)
        plan.append((spans[(i, j)], spans[(j, k)]))

    walk(0, n)
    return plan


def extend(tokenizer_dir: str, tk: TokenizerConfig, batches_fn: Callable[[], Iterable[list[str]]]) -> dict[str, Any]:
    """Extend the checkpoint's tokenizer in the local directory `tokenizer_dir` (its copy, not yet
    committed) as the tokenizer section `tk` asks; `batches_fn()` gives the corpus sample (called twice: for
    the words, then for the tokens per word after). Writes tokenizer.json and the record; returns it."""
    path = os.path.join(tokenizer_dir, "tokenizer.json")
    base_json = open(path, encoding="utf-8").read()
    base = Speller(base_json)
    if base.kind not in ("BPE", "WordPiece", "Unigram"):
        raise UserError(f"tokenizer.extend_tokens: the checkpoint's tokenizer is a {base.kind} model; only BPE, "
                        f"WordPiece and Unigram tokenizers can be extended")
    first_id = base.tok.get_vocab_size(with_added_tokens=True)
    if max(base.vocab.values()) + 1 != first_id:
        raise UserError(f"tokenizer.extend_tokens: the checkpoint's tokenizer has ids up to {max(base.vocab.values())} "
                        f"for {first_id} tokens (gaps); its vocabulary cannot be extended")
    data = json.loads(base_json)
    chosen: list[tuple[str, list[str], str]] = []  # token, parts, origin
    if tk.add_tokens_file:
        for _, spelled in file_tokens(tk.add_tokens_file, base):
            chosen.append((spelled, [p for p, _ in base.pieces(spelled)], "file"))
    ids = install(data, base, [(t, parts) for t, parts, _ in chosen], first_id)
    origin = {t: "file" for t in ids}
    counts, words = count_words(base, batches_fn())
    if tk.extend_tokens:
        current = Speller(json.dumps(data))  # the file's tokens already in: learning starts from them
        learned = learn(current, counts, tk.extend_tokens, set(ids))
        if len(learned) < tk.extend_tokens:
            log.warning("tokenizer: learned %d of tokenizer.extend_tokens=%d tokens: no other pair of pieces "
                        "occurs %d times or more in the corpus sample (%d words)", len(learned), tk.extend_tokens,
                        MIN_COUNT, words)
        new = install(data, current, [(t, [a, b]) for t, a, b in learned], first_id + len(ids))
        ids.update(new)
        origin.update({t: "learned" for t in new})
    new_json = json.dumps(data, ensure_ascii=False)
    extended = Tokenizer.from_str(new_json)
    before = tokens_per_word(base.tok, batches_fn())
    after = tokens_per_word(extended, batches_fn())
    tokens = [NewToken(t, i, origin[t], tuple(int(p) for _, p in base.pieces(t))) for t, i in sorted(
        ids.items(), key=lambda kv: kv[1])]
    record = {
        "base_sha256": _sha(base_json), "base_vocab_size": first_id, "vocab_size": first_id + len(tokens),
        "extend_tokens": tk.extend_tokens, "add_tokens_file": tk.add_tokens_file,
        "add_tokens_sha256": _sha(storage.read_text(tk.add_tokens_file)) if tk.add_tokens_file else None,
        "kind": base.kind, "tokens_per_word_before": round(before, 5), "tokens_per_word_after": round(after, 5),
        "sample_words": words,
        "origin": dict(Counter(t.origin for t in tokens)),
        "tokens": [{"token": t.token, "text": base.shown(t.token), "id": t.id, "origin": t.origin,
                    "pieces": list(t.pieces)} for t in tokens],
    }
    with open(path, "w", encoding="utf-8") as f:
        f.write(new_json)
    for name in SLOW_FILES:  # they would still hold the checkpoint's vocabulary
        if os.path.exists(os.path.join(tokenizer_dir, name)):
            os.remove(os.path.join(tokenizer_dir, name))
    _drop_slow_names(tokenizer_dir)
    with open(os.path.join(tokenizer_dir, EXTENSION_FILE), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)
        f.write("\n")
    log.info("tokenizer: %d tokens added (%s); tokens per word on the corpus sample %.3f -> %.3f", len(tokens),
             ", ".join(f"{n} {o}" for o, n in record["origin"].items()), before, after)
    return record


def _drop_slow_names(tokenizer_dir: str) -> None:
    """tokenizer_config.json may name the slow files removed above: transformers would look for them."""
    path = os.path.join(tokenizer_dir, "tokenizer_config.json")
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        conf = json.load(f)
    changed = False
    for key in ("vocab_file", "merges_file", "sp_model_file"):
        if key in conf:
            conf.pop(key)
            changed = True
    if changed:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(conf, f, indent=2, ensure_ascii=False)


def _sha(text: str) -> str:
    from tpu_ray.prepare.tokenizer import canonical_json

    try:
        return hashlib.sha256(canonical_json(text)).hexdigest()
    except ValueError:  # not JSON (a tokens file)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_record(tokenizer_dir: str) -> dict[str, Any] | None:
    """The extension record of a tokenizer directory, or None (a tokenizer as the checkpoint has it)."""
    path = storage.join(tokenizer_dir, EXTENSION_FILE)
    if not storage.exists(path):
        return None
    try:
        data = json.loads(storage.read_text(path))
    except (ValueError, UnicodeDecodeError) as exc:
        data = exc
    ok = isinstance(data, dict) and isinstance(data.get("tokens"), list) and all(
        isinstance(t, dict) and isinstance(t.get("token"), str) and isinstance(t.get("id"), int)
        and isinstance(t.get("pieces"), list) and t["pieces"] for t in data["tokens"]) \
        and isinstance(data.get("base_vocab_size"), int) and isinstance(data.get("base_sha256"), str)
    if not ok:
        raise UserError(f"{path}: damaged (not the record of a vocabulary extension); make the tokenizer again "
                        f"with `tpu-ray tokenizer --force`")
    return data


def check_growth(record: dict[str, Any], tokenizer_json: str, base_json: str, rows: int, where: str) -> None:
    """The tokenizer is the checkpoint's (`base_json`, `rows` embedding rows) plus exactly the
    record's tokens at ids rows.. ; anything else is refused in one line."""
    fix = "make it again with `tpu-ray tokenizer --force`, or use the checkpoint's own tokenizer"
    if record["base_sha256"] != _sha(base_json):
        raise UserError(f"{where}: extended from another tokenizer than the checkpoint's (sha256 "
                        f"{record['base_sha256'][:12]}); {fix}")
    base = Tokenizer.from_str(base_json).get_vocab(with_added_tokens=True)
    if record["base_vocab_size"] != rows or len(base) != rows:
        raise UserError(f"{where}: extends a vocabulary of {record['base_vocab_size']} tokens, but the checkpoint's "
                        f"embedding has {rows} rows; {fix}")
    vocab = Tokenizer.from_str(tokenizer_json).get_vocab(with_added_tokens=True)
    want = {t["token"]: t["id"] for t in record["tokens"]}
    if sorted(want.values()) != list(range(rows, rows + len(want))):
        raise UserError(f"{where}: the added tokens' ids are not {rows}..{rows + len(want) - 1}; {fix}")
    moved = [t for t, i in base.items() if vocab.get(t) != i]
    extra = {t: i for t, i in vocab.items() if t not in base}
    if moved or extra != want:
        what = f"token {moved[0]!r} moved" if moved else \
            f"{len(set(extra) ^ set(want))} token(s) differ from {EXTENSION_FILE}"
        raise UserError(f"{where}: not the checkpoint's vocabulary plus the recorded tokens ({what}); {fix}")


def tokens_file_changed(record: dict[str, Any], path: str | None) -> bool:
    """Whether the tokens file the record was made from now holds other text (a missing file is
    not a change: the tokenizer made from it stands on its own)."""
    want = record.get("add_tokens_sha256")
    if not path or not want or not storage.exists(path):
        return False
    try:
        return _sha(storage.read_text(path)) != want
    except (OSError, UnicodeDecodeError):
        return True


def summary_fields(tokenizer_dir: str) -> dict[str, Any]:
    """What summary.json's `tokenizer` says of an extension (nothing for a tokenizer not extended)."""
    record = read_record(tokenizer_dir)
    if record is None:
        return {}
    return {"tokens_per_word_before": record["tokens_per_word_before"],
            "tokens_per_word_after": record["tokens_per_word_after"],
            "added_tokens": len(record["tokens"]), "added_tokens_origin": record.get("origin", {}),
            "base_vocab_size": record["base_vocab_size"]}


def card_line(tokenizer_dir: str) -> str | None:
    """The model card's line on added tokens: how many, from where (None: not extended)."""
    try:
        record = read_record(tokenizer_dir)
    except UserError:
        return None
    if record is None:
        return None
    origin = record.get("origin", {})
    parts = []
    if origin.get("learned"):
        parts.append(f"{origin['learned']} learned on the corpus (tokenizer.extend_tokens={record.get('extend_tokens')})")
    if origin.get("file"):
        parts.append(f"{origin['file']} from `{record.get('add_tokens_file')}` (tokenizer.add_tokens_file)")
    examples = ", ".join(f"`{t['text']}`" for t in record["tokens"][:8])
    return (f"- vocabulary: the checkpoint's {record['base_vocab_size']} tokens + {len(record['tokens'])} added "
            f"({'; '.join(parts)}), e.g. {examples}; each new embedding row started as the mean of its pieces' "
            f"rows; tokens per word on the corpus {record['tokens_per_word_before']:.3f} -> "
            f"{record['tokens_per_word_after']:.3f}")
