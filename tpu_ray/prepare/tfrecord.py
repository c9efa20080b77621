"""TFRecord files of `tf.train.Example` written without TensorFlow.

Why by hand: the sharding actors must not import TensorFlow (libtpu allows one owner per TPU host,
and TF costs ~2 s and ~1 GB per actor), and serializing one Example per sample through protobuf in
Python is the reference workflow's bottleneck. The wire format is small and stable: an Example is
`features{feature{key, int64_list{packed varints}}}`, a TFRecord is `len, crc(len), data, crc(data)`
with masked CRC-32C. Here the varints of a whole work unit are encoded at once with numpy.
Tests read the output back with `tf.data.TFRecordDataset` + `tf.io.parse_single_example`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import google_crc32c
import numpy as np

_MASK_DELTA = 0xA282EAD8


def _masked_crc(data: bytes) -> bytes:
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Encode non-negative ints as protobuf varints; returns (bytes, per-value byte counts).

    All values at once: a [n, width] matrix of 7-bit groups, then a mask keeps each value's bytes.
    """
    v = values.astype(np.uint64, copy=False).ravel()
    if not len(v):
        return np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.int64)
    width = len(_varint(int(v.max())))
    if width == 1:  # every value fits one byte: the values are their own encoding
        return v.astype(np.uint8), np.ones(v.shape, dtype=np.int64)
    nbytes = np.ones(v.shape, dtype=np.uint8)
    for k in range(1, width):
        nbytes += v >= np.uint64(1 << (7 * k))
    groups = np.empty((len(v), width), dtype=np.uint8)
    for k in range(width):
        groups[:, k] = (v >> np.uint64(7 * k)) & np.uint64(0x7F)
        groups[:, k] |= (nbytes > k + 1).view(np.uint8) << 7  # continuation bit
    return groups[np.arange(width) < nbytes[:, None]], nbytes.astype(np.int64)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


def _prefix(number: int, length: int) -> bytes:
    """The tag and length of a length-delimited field whose payload is `length` bytes."""
    return bytes([number << 3 | 2]) + _varint(length)


def _int64_feature(key: bytes, packed: bytes) -> bytes:
    # map<string, Feature> entry {1: key, 2: Feature{3: Int64List{1: packed}}}
    feature = _field(3, _field(1, packed))
    return _field(1, _field(1, key) + _field(2, feature))


def _ids_prefix(packed_len: int, mask_entry_len: int) -> bytes:
    """Everything of an Example that precedes its packed input_ids: it depends on their length only."""
    key = _field(1, b"input_ids")
    int64_list = 1 + len(_varint(packed_len)) + packed_len
    feature = 1 + len(_varint(int64_list)) + int64_list
    entry = len(key) + 1 + len(_varint(feature)) + feature
    features = 1 + len(_varint(entry)) + entry + mask_entry_len
    return (_prefix(1, features) + _prefix(1, entry) + key + _prefix(2, feature) + _prefix(3, int64_list)
            + _prefix(1, packed_len))


def _packed_rows(input_ids: np.ndarray) -> tuple[bytes, list[int], list[int]]:
    """Varints of all rows as one buffer, with each row's (start, length) in it."""
    n, seq_len = input_ids.shape
    flat, nbytes = _varints(input_ids)
    lengths = nbytes.reshape(n, seq_len).sum(axis=1)
    starts = np.cumsum(lengths) - lengths
    return flat.tobytes(), starts.tolist(), lengths.tolist()


def serialize_examples(input_ids: np.ndarray, text_bytes: np.ndarray | None = None) -> Iterator[bytes]:
    """Yield one serialized Example per row of `input_ids` [n, seq_len], attention_mask all ones,
    and with `text_bytes` (validation rows: each token's UTF-8 bytes of text) a `text_bytes` feature.

    Samples are full chunks of concatenated text, so they never contain padding.
    """
    if input_ids.shape[0] == 0:
        return
    mask_entry = _int64_feature(b"attention_mask", b"\x01" * input_ids.shape[1])
    if text_bytes is not None:  # validation only (a few % of rows): one row at a time
        for ids, nbytes in zip(input_ids, text_bytes):
            entries = (_int64_feature(b"input_ids", _varints(ids)[0].tobytes()) + mask_entry
                       + _int64_feature(b"text_bytes", _varints(nbytes)[0].tobytes()))
            yield _field(1, entries)
        return
    data, starts, lengths = _packed_rows(input_ids)
    prefixes: dict[int, bytes] = {}
    for start, length in zip(starts, lengths):
        prefix = prefixes.get(length) or prefixes.setdefault(length, _ids_prefix(length, len(mask_entry)))
        yield prefix + data[start:start + length] + mask_entry


def _frame(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + _masked_crc(header) + data + _masked_crc(data)


def write_records(f: BinaryIO, records: Iterable[bytes]) -> int:
    """Frame and write records; returns how many."""
    count = 0
    for data in records:
        f.write(_frame(data))
        count += 1
    return count


def examples_file(input_ids: np.ndarray, text_bytes: np.ndarray | None = None) -> bytes:
    """The whole TFRecord file of `serialize_examples(input_ids, text_bytes)`, built in one buffer.

    Why: the sharding hot path. Records of equal length share their header and its CRC, so per
    row only the data CRC is computed (in C); everything else is numpy or a cached prefix.
    """
    headers: dict[int, bytes] = {}
    out: list[bytes] = []
    for data in serialize_examples(input_ids, text_bytes):
        header = headers.get(len(data))
        if header is None:
            length = struct.pack("<Q", len(data))
            header = headers[len(data)] = length + _masked_crc(length)
        out += (header, data, _masked_crc(data))
    return b"".join(out)


def read_records(f: BinaryIO) -> Iterator[bytes]:
    """Read framed records, checking both CRCs (used by tests and `doctor`, not by training)."""
    while True:
        header = f.read(8)
        if not header:
            return
        if len(header) < 8 or f.read(4) != _masked_crc(header):
            raise ValueError("truncated or corrupt record header")
        (length,) = struct.unpack("<Q", header)
        data = f.read(length)
        if len(data) < length or f.read(4) != _masked_crc(data):
            raise ValueError("truncated or corrupt record data")
        yield data
