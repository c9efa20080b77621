"""Long lines cut into bounded pieces before tokenizing (corpus.max_line_bytes).

Why: a tokenizer's memory grows with the text it encodes in one call; a 50 MB line with no newline
took a shard actor to 7 GB and the tokenizer trainer to 4.4 GB. Both the trainer's reader and the
shard actors cut such lines into pieces, and the driver warns how many were cut.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

log = logging.getLogger("tpu_ray.prepare.corpus")


def warn_split_lines(count: int, max_line_bytes: int | None, stage: str) -> None:
    if count:
        log.warning("%s: %d line(s) longer than corpus.max_line_bytes=%d were split at whitespace (or at that "
                    "bound); raise it to keep longer lines whole", stage, count, max_line_bytes)


def split_long_lines(lines: list[str], max_bytes: int) -> tuple[list[str], int]:
    """`lines` with every line over `max_bytes` UTF-8 bytes cut into pieces of at most that many,
    at the last whitespace of each piece when there is one; returns (lines, lines that were cut).

    Why: a tokenizer's memory grows with the length of the text it encodes in one call (a 50 MB
    line took a shard actor to 7 GB); pieces keep it flat. Most lines pass the cheap length test.
    """
    out: list[str] = []
    cut = 0
    for line in lines:
        if len(line) * 4 <= max_bytes or len(data := line.encode("utf-8")) <= max_bytes:
            out.append(line)
            continue
        cut += 1
        out.extend(_pieces(data, max_bytes))
    return out, cut


def _pieces(data: bytes, max_bytes: int) -> Iterator[str]:
    start, n = 0, len(data)
    while start < n:
        end = min(start + max_bytes, n)
        if end < n:
            space = max(data.rfind(b" ", start + max_bytes // 2, end), data.rfind(b"\t", start + max_bytes // 2, end))
            if space > start:
                end = space + 1
            else:
                while end > start and (data[end] & 0xC0) == 0x80:  # not inside a UTF-8 character
                    end -= 1
        piece = data[start:end].decode("utf-8", errors="replace").strip()
        if piece:
            yield piece
        start = end
