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
from collections.abc import Iterator
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
    """Encode non-negative ints as protobuf varints; returns (bytes, per-value byte counts)."""
    v = values.astype(np.uint64, copy=False).ravel()
    nbytes = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        nbytes += v >= np.uint64(1 << (7 * k))
    ends = np.cumsum(nbytes)
    starts = ends - nbytes
    out = np.zeros(int(ends[-1]) if len(ends) else 0, dtype=np.uint8)
    for k in range(int(nbytes.max()) if len(v) else 0):
        sel = nbytes > k
        chunk = (v[sel] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (nbytes[sel] > k + 1).astype(np.uint64) << np.uint64(7)
        out[starts[sel] + k] = (chunk | more).astype(np.uint8)
    return out, nbytes


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


def _int64_feature(key: bytes, packed: bytes) -> bytes:
    # map<string, Feature> entry {1: key, 2: Feature{3: Int64List{1: packed}}}
    feature = _field(3, _field(1, packed))
    return _field(1, _field(1, key) + _field(2, feature))


def serialize_examples(input_ids: np.ndarray) -> Iterator[bytes]:
    """Yield one serialized Example per row of `input_ids` [n, seq_len], attention_mask all ones.

    Samples are full chunks of concatenated text, so they never contain padding.
    """
    n, seq_len = input_ids.shape
    if n == 0:
        return
    flat, nbytes = _varints(input_ids)
    row_ends = np.cumsum(nbytes.reshape(n, seq_len).sum(axis=1))
    mask_entry = _int64_feature(b"attention_mask", b"\x01" * seq_len)
    data = flat.tobytes()
    start = 0
    for end in row_ends.tolist():
        ids_entry = _int64_feature(b"input_ids", data[start:end])
        yield _field(1, ids_entry + mask_entry)
        start = end


def write_records(f: BinaryIO, records: Iterator[bytes]) -> int:
    """Frame and write records; returns how many."""
    count = 0
    for data in records:
        header = struct.pack("<Q", len(data))
        f.write(header + _masked_crc(header) + data + _masked_crc(data))
        count += 1
    return count


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
