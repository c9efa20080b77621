"""The corpus formats' names and compressions, and opening compressed files as decompressed streams.

Compression is inferred from the suffix with fsspec's table (`fsspec.utils.compressions`: .gz
.bz2 .xz .zst ...); a suffix that names a compression this installation cannot read is refused in
one line instead of read as text. Which format a file is (`detect`) is the readers' to say: it
lives in tpu_ray/prepare/readers/, whose classes name their suffixes.
"""

from __future__ import annotations

import io
from typing import IO, Literal

from tpu_ray import storage
from tpu_ray.errors import UserError

Format = Literal["txt", "jsonl", "parquet", "csv", "tsv", "hf", "hf_disk"]
# fsspec's suffix -> compression; zip is an archive of files, not a stream of text: not one.
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd", ".lzma": "lzma"}
# Suffixes of compressions/archives we cannot stream: named in the error rather than read as text.
UNSUPPORTED = (".zip", ".lz4", ".br", ".snappy", ".sz", ".7z", ".tar", ".tgz", ".z", ".lzo", ".rar")


def open_decompressed(path: str, compression: str | None, whole: bool = False) -> IO[bytes]:
    """A binary stream of the file's decompressed bytes (the file itself when not compressed).

    `whole`: fetch the stored bytes in one read (one GET on object stores: no info request, no
    readahead blocks), for files known to be small (the members of a packed unit).

    gzip/bz2/xz through fsspec's registry (they raise EOFError on a truncated stream). zstd by hand:
    fsspec's zstandard reader returns a truncated stream's bytes and then a clean EOF (checked with
    zstandard 0.25), which would train on half a file without a word.
    """
    raw = io.BytesIO(storage.read_bytes(path)) if whole else storage.open(path, "rb")
    if compression is None:
        return raw
    if compression == "zstd":
        return io.BufferedReader(_ZstdReader(raw), buffer_size=1 << 20)
    from fsspec.compression import compr

    if compression not in compr:
        raw.close()
        raise UserError(f"{path}: compression {compression!r} is not installed; pip install its package or "
                        f"decompress the file")
    return compr[compression](raw, mode="rb")


class _ZstdReader(io.RawIOBase):
    """zstd frames (one or many, as `zstd`/`pzstd` write them) decompressed; a cut stream raises EOFError."""

    def __init__(self, raw: IO[bytes]):
        import zstandard

        self._raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = self._dctx.decompressobj()
        self._fed = False  # the current frame has input it has not finished
        self._buf = b""
        self._pos = 0

    def readable(self) -> bool:
        return True

    def _fill(self) -> None:
        if self._pos >= len(self._buf):
            self._buf, self._pos = b"", 0
        while not self._buf:
            if self._obj.eof:
                rest = self._obj.unused_data
                self._obj, self._fed = self._dctx.decompressobj(), False
                if rest:
                    self._fed = True
                    self._buf = self._obj.decompress(rest)
                    continue
            data = self._raw.read(1 << 20)
            if not data:
                if self._fed and not self._obj.eof:
                    raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                return
            self._fed = True
            self._buf = self._obj.decompress(data)

    def readinto(self, b) -> int:
        self._fill()
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = memoryview(self._buf)[self._pos: self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def is_saved_dataset(path: str) -> bool:
    """A `datasets` save_to_disk directory: `state.json` (a Dataset) or `dataset_dict.json` (a DatasetDict)."""
    return storage.exists(storage.join(path, "state.json")) or storage.exists(storage.join(path, "dataset_dict.json"))


# Byte-order marks (longest first: UTF-32's little-endian mark begins with UTF-16's).
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32 (little-endian)"), (b"\x00\x00\xfe\xff", "UTF-32 (big-endian)"),
         (b"\xef\xbb\xbf", "UTF-8"), (b"\xff\xfe", "UTF-16 (little-endian)"), (b"\xfe\xff", "UTF-16 (big-endian)"))


def byte_order_mark(head: bytes, path: str) -> int:
    """How many bytes of a UTF-8 byte-order mark open a file's text (3 or 0): never text.

    A UTF-16 or UTF-32 mark is refused in one line naming the file and the encoding: its text would
    otherwise be read as NUL bytes or trained as replacement characters."""
    for mark, name in _BOMS:
        if head.startswith(mark):
            if name == "UTF-8":
                return len(mark)
            raise UserError(f"{path}: starts with a {name} byte-order mark: only UTF-8 text is read; convert it "
                            f"(e.g. iconv -f {name.split()[0]} -t UTF-8 FILE > FILE.utf8.txt)")
    return 0
