"""TFRecord reading speed with and without the data checksum (``verify_data``).

Usage: ``python benchmarks/bench_tfrecord_verify.py LABEL`` (LABEL names the
tree in the output, e.g. ``main`` or ``new``). Builds in memory 5,000 records
of 200 bytes and 100 of 100 KB (one ``bytes_list`` feature each) and reads
them with ``load_from_tfrecord``, best of 3; MB/s of file bytes.
"""

from __future__ import annotations

import io
import os
import struct
import sys
import time

from pipeloom.datapipes import IterableWrapper
from pipeloom.datapipes._tfrecord import masked_crc32c


def _varint(n: int) -> bytes:
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([low])
        out += bytes([low | 0x80])


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


def record(payload: bytes) -> bytes:
    """An ``Example`` with the feature ``x``: a bytes list holding ``payload``."""
    feature = _field(1, _field(1, payload))
    entry = _field(1, b"x") + _field(2, feature)
    return _field(1, _field(1, entry))


def frame(data: bytes) -> bytes:
    head = struct.pack("<Q", len(data))
    crcs = struct.pack("<I", masked_crc32c(head)), struct.pack("<I", masked_crc32c(data))
    return head + crcs[0] + data + crcs[1]


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "tree"
    for size, count in [(200, 5000), (100_000, 100)]:
        data = b"".join(frame(record(os.urandom(size))) for _ in range(count))
        for verify in (False, True):
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                files = IterableWrapper([("a", io.BytesIO(data))])
                sum(1 for _ in files.load_from_tfrecord(verify_data=verify))
                best = min(best, time.perf_counter() - start)
            print(
                f"{label:5} record {size:>7} B verify_data={verify!s:5}: "
                f"{len(data) / best / 1e6:7.1f} MB/s, {count / best:9.0f} records/s"
            )


if __name__ == "__main__":
    main()
