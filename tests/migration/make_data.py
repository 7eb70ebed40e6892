"""The files the migration pipelines read, made the same way every time (no download).

Used by the test and by ``scripts/record_torchdata_fixtures.py``, which ran
the same pipelines under torchdata 0.9 to record the expected outputs.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import pathlib
import random
import struct
import tarfile
import zipfile


def make_data(root: pathlib.Path) -> pathlib.Path:
    """Write every data set under ``root``; return ``root``."""
    _csv(root / "csv")
    _json(root / "json")
    _tar(root / "tar")
    _zip(root / "zip")
    _compressed(root / "compressed")
    _text(root / "text")
    _served(root / "served")
    _tfrecord(root / "tfrecord")
    return root


def _dir(path: pathlib.Path) -> pathlib.Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _csv(folder: pathlib.Path) -> None:
    _dir(folder)
    for label in range(3):
        rng = random.Random(label)
        lines = ["label,c0,c1,c2"]
        for _ in range(10):
            values = [f"{rng.random():.6f}" for _ in range(3)]
            lines.append(",".join([str(rng.randint(0, 9)), *values]))
        (folder / f"sample_data{label}.csv").write_text("\n".join(lines) + "\n")
    (folder / "notes.txt").write_text("not a csv\n")
    (folder / "quoted.tsv").write_bytes(
        '# exported\nname\tnote\n"a\tb"\tcafé\nc\t"x ""y"""\n'.encode()
    )


def _json(folder: pathlib.Path) -> None:
    _dir(folder)
    for part in range(2):
        rows = [
            {"id": part * 10 + i, "label": (part + i) % 3, "text": f"sample {part}-{i}"}
            for i in range(7)
        ]
        (folder / f"data_{part}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "1.json").write_text(json.dumps(["foo", {"bar": ["baz", None, 1.0, 2]}]))
    (folder / "2.json").write_text(json.dumps({"__complex__": True, "real": 1, "imag": 2}))


def _tar_bytes(members: list[tuple[str, bytes]], mode: str = "w") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _samples(shard: int) -> list[tuple[str, bytes]]:
    members = []
    for index in range(3):
        key = f"s{shard}_{index:02d}"
        members.append((f"{key}.txt", f"line one of {key}\nline two\n".encode()))
        members.append((f"{key}.json", json.dumps({"key": key, "n": index}).encode()))
        members.append((f"{key}.cls", str(index % 2).encode()))
    return members


def _tar(folder: pathlib.Path) -> None:
    _dir(folder)
    for shard in range(2):
        (folder / f"shard-{shard}.tar").write_bytes(_tar_bytes(_samples(shard)))
    _dir(folder / "gz")
    (folder / "gz" / "shard-2.tar.gz").write_bytes(_tar_bytes(_samples(2), mode="w:gz"))


def _zip(folder: pathlib.Path) -> None:
    _dir(folder)
    for part in range(2):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.mkdir("data")
            archive.writestr("data/rows.csv", f"k,v\nz{part},1\ny{part},2\n")
            archive.writestr("data/readme.txt", f"archive {part}\nsecond line\n")
        (folder / f"archive-{part}.zip").write_bytes(buffer.getvalue())


def _compressed(folder: pathlib.Path) -> None:
    _dir(folder)
    text = [f"compressed {n}\nsecond\n".encode() for n in range(3)]
    (folder / "notes-0.txt.bz2").write_bytes(bz2.compress(text[0]))
    (folder / "notes-1.txt.xz").write_bytes(lzma.compress(text[1]))
    (folder / "notes-2.txt.gz").write_bytes(gzip.compress(text[2], mtime=0))


def _text(folder: pathlib.Path) -> None:
    _dir(folder)
    (folder / "corpus-0.txt").write_bytes(
        b"First paragraph, line one.\nline two.\n\nSecond paragraph.\n\n\n\n"
        b"Third,\r\nwith CRLF.\r\n"
    )
    (folder / "corpus-1.txt").write_text("A lone line\n\nB one\nB two\nB three\n")
    rng = random.Random(7)
    words = ["data", "loader", "token", "bucket", "batch", "shard", "epoch", "seed"]
    sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 9))) for _ in range(40)]
    (folder / "sentences.txt").write_text("\n".join(sentences) + "\n")


def _served(folder: pathlib.Path) -> None:
    _dir(folder)
    rows = ["id,value"] + [f"{i},{i * i}" for i in range(20)]
    (folder / "dataset.csv").write_text("\n".join(rows) + "\n")


# -- TFRecord: records framed with masked CRC-32C, Examples in protobuf's wire format ---------


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> bytes:
    crc = _crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(value: list) -> bytes:
    if all(isinstance(v, bytes) for v in value):
        return _field(1, b"".join(_field(1, v) for v in value))
    if all(isinstance(v, float) for v in value):
        return _field(2, _field(1, struct.pack(f"<{len(value)}f", *value)))
    return _field(3, _field(1, b"".join(_varint(v) for v in value)))


def _features(features: dict) -> bytes:
    return b"".join(
        _field(1, _field(1, key.encode()) + _field(2, _feature(value)))
        for key, value in features.items()
    )


def _frame(record: bytes) -> bytes:
    head = struct.pack("<Q", len(record))
    return head + _masked(head) + record + _masked(record)


def _tfrecord(folder: pathlib.Path) -> None:
    _dir(folder)
    examples = []
    for index in range(4):
        features = {
            "label": [index % 2],
            "pixels": [float(index) + k / 4 for k in range(6)],
            "name": [f"img{index}".encode(), b"jpg"],
            "offsets": [-index, 2**40 + index],
        }
        examples.append(_field(1, _features(features)))
    (folder / "examples.tfrecord").write_bytes(b"".join(_frame(e) for e in examples))
    sequences = []
    for index in range(2):
        context = _features({"length": [index + 2]})
        steps = [_feature([float(index + step), 0.5]) for step in range(index + 2)]
        lists = _field(1, _field(1, b"frames") + _field(2, b"".join(_field(1, s) for s in steps)))
        sequences.append(_field(1, context) + _field(2, lists))
    (folder / "sequences.tfrecord").write_bytes(b"".join(_frame(s) for s in sequences))
