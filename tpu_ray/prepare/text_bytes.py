"""The UTF-8 bytes of text each token of a line stands for, from the tokenizer's own offsets.

Why: bits per byte divides the model's bits by the bytes of the text it scored. The ids alone do
not say those bytes: a WordPiece pre-tokenizer drops the spaces between words and splits
punctuation off ("hello, world" -> `hello` `,` `world`: whether a space came before `,` is lost),
Metaspace and normalisers (NFKC) fold some characters. The offsets of the encoding point into the
original line, so each token is given the bytes from the end of the token before it to its own
end: the whitespace before a word counts with the word, a character split into several byte-level
tokens counts once, and a line's bytes sum to the line's UTF-8 length (what follows the last token,
trailing whitespace, counts with it). A line that gives no token (whitespace only) gives no bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate


def bytes_per_token(line: str, offsets: Sequence[tuple[int, int]]) -> list[int]:
    """Per token of `line` (character `offsets` into it, as `tokenizers` reports them): its bytes."""
    if not offsets:
        return []
    n = len(line)
    # character offset -> byte offset (ASCII, most lines: the same)
    ends = None if line.isascii() else [0, *accumulate(len(ch.encode()) for ch in line)]
    out, done = [], 0
    for _, end in offsets:
        end = min(max(end, 0), n) if ends is None else ends[min(max(end, 0), n)]
        out.append(max(end - done, 0))
        done = max(done, end)
    out[-1] += (n if ends is None else ends[-1]) - done
    return out
