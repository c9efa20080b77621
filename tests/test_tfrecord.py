"""Our TF-free TFRecord writer against TensorFlow's reader, and the reference format both ways."""

import io

import numpy as np
import pytest

from tpu_ray.prepare.tfrecord import _varints, examples_file, read_records, serialize_examples, write_records

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def _decode_varints(buf: bytes) -> list[int]:
    out, cur, shift = [], 0, 0
    for b in buf:
        cur |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            out.append(cur)
            cur, shift = 0, 0
    return out


def test_varints_round_trip_across_byte_widths():
    values = np.array([0, 1, 127, 128, 300, 16383, 16384, 2**21, 2**28 + 5, 2**35], dtype=np.int64)
    encoded, nbytes = _varints(values)
    assert nbytes.tolist() == [1, 1, 1, 2, 2, 2, 3, 4, 5, 6]
    assert _decode_varints(encoded.tobytes()) == values.tolist()


def test_tensorflow_reads_our_records_exactly(tmp_path):
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 50_000, size=(37, 16), dtype=np.int64)
    path = tmp_path / "train-00000-37.tfrecord"
    with open(path, "wb") as f:
        assert write_records(f, serialize_examples(rows)) == 37
    spec = {k: tf.io.FixedLenFeature([16], tf.int64) for k in ("input_ids", "attention_mask")}
    got = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(str(path))]
    assert len(got) == 37
    np.testing.assert_array_equal(np.stack([g["input_ids"].numpy() for g in got]), rows)
    assert all((g["attention_mask"].numpy() == 1).all() for g in got)


def test_our_reader_reads_tensorflow_records_and_detects_truncation(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = str(tmp_path / "ref.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(5):
            ex = tf.train.Example(features=tf.train.Features(feature={
                "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[i, i + 1, 300])),
            }))
            w.write(ex.SerializeToString())
    data = open(path, "rb").read()
    records = list(read_records(io.BytesIO(data)))
    assert len(records) == 5
    parsed = tf.train.Example.FromString(records[3])
    assert list(parsed.features.feature["input_ids"].int64_list.value) == [3, 4, 300]
    with pytest.raises(ValueError, match="truncated"):
        list(read_records(io.BytesIO(data[:-7])))


@pytest.mark.parametrize("high,shape", [(100, (9, 8)), (20_000, (300, 128)), (2**40, (5, 16)), (2**62, (3, 8))])
def test_whole_file_writer_equals_record_by_record_framing(high, shape):
    """examples_file (the sharding hot path) gives the bytes write_records gives, which TF reads."""
    rows = np.random.default_rng(high).integers(0, high, size=shape, dtype=np.int64)
    framed = io.BytesIO()
    assert write_records(framed, serialize_examples(rows)) == shape[0]
    data = examples_file(rows)
    assert data == framed.getvalue()
    assert len(list(read_records(io.BytesIO(data)))) == shape[0]
    assert examples_file(rows[:0]) == b""
