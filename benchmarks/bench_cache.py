"""Caching a decode-heavy pipeline: the first epoch against the later ones, one run.

    python benchmarks/bench_cache.py [--quick]

Writes N JPEG files (512x384) to a temporary directory. The pipeline lists
them, decodes each with Pillow, resizes it to 224x224 and makes a uint8
tensor, then batches 32 and collates:

* ``snapshot``: ``.snapshot(dir)`` after the decode: epoch 1 runs the decode
  and writes the items; epoch 2 reads them back;
* ``in_memory_cache``: ``.in_memory_cache()`` after the decode: epoch 1 fills
  it; epoch 2 replays it;

each in the calling process and with two worker processes
(``persistent_workers=True``, so their in-memory caches survive the epoch).
For reference, ``torch.utils.data.DataLoader`` over a ``Dataset`` with the
same decode (no cache: every epoch decodes), with 0 and 2 workers.

The batches of epoch 2 are checked equal to epoch 1's and to torch's.
Higher items/s is better; the ratio is epoch 2 over epoch 1.

A second table compares the ways a snapshot could store an item: pickle
protocol 5 with out-of-band buffers (what it does), pickle in band, and
``torch.save``; microseconds to write and to read back one item through a file.
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import shutil
import tempfile
import time

import numpy as np
import torch
import torch.utils.data
from _common import print_table
from PIL import Image

import pipeloom
from pipeloom.datapipes import FileLister
from pipeloom.datapipes._records import RecordReader, RecordWriter, combine
from pipeloom.reading_service import MultiProcessingReadingService

BATCH = 32
SIZE = (224, 224)


def write_images(root: str, count: int) -> None:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:384, 0:512]
    for i in range(count):
        base = (np.sin(x / (20 + i % 7)) + np.cos(y / (15 + i % 5))) * 60 + 128
        noise = rng.normal(0, 12, (384, 512, 3))
        pixels = np.clip(base[..., None] + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(root, f"img{i:05d}.jpg"), quality=90)


def decode(path: str) -> torch.Tensor:
    with Image.open(path) as image:
        small = image.convert("RGB").resize(SIZE, Image.BILINEAR)
        return torch.from_numpy(np.asarray(small).copy()).permute(2, 0, 1).contiguous()


def pipeline(images: str, cache: str, kind: str):
    decoded = FileLister(images, "*.jpg").sharding_filter().map(decode)
    cached = decoded.snapshot(cache) if kind == "snapshot" else decoded.in_memory_cache()
    return cached.batch(BATCH).collate()


class Decoded(torch.utils.data.Dataset):
    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return decode(self.paths[index])


def timed_epoch(loader) -> tuple[float, list[torch.Tensor]]:
    start = time.perf_counter()
    batches = list(loader)
    return time.perf_counter() - start, batches


def run_pipeloom(images, count, kind, workers, repeats):
    """Best epoch-1 and epoch-2 times over ``repeats`` fresh caches, and the batches."""
    best = [float("inf"), float("inf")]
    batches: list = []
    for _ in range(repeats):
        cache = tempfile.mkdtemp(prefix="pipeloom-bench-cache-")
        try:
            service = None
            if workers:
                service = MultiProcessingReadingService(workers, persistent_workers=True)
            with pipeloom.DataLoader(pipeline(images, cache, kind), service, seed=0) as loader:
                first, batches_first = timed_epoch(loader)
                second, batches_second = timed_epoch(loader)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        same(batches_first, batches_second, f"{kind}, {workers} workers: epoch 2 vs epoch 1")
        best = [min(best[0], first), min(best[1], second)]
        batches = batches_second
    return count / best[0], count / best[1], batches


def run_torch(images, count, workers, repeats):
    paths = sorted(os.path.join(images, f) for f in os.listdir(images))
    loader = torch.utils.data.DataLoader(
        Decoded(paths), batch_size=BATCH, num_workers=workers, persistent_workers=workers > 0
    )
    best, batches = float("inf"), []
    for _ in range(repeats):
        elapsed, batches = timed_epoch(loader)
        best = min(best, elapsed)
    return count / best, batches


def same(a: list[torch.Tensor], b: list[torch.Tensor], what: str) -> None:
    if len(a) != len(b) or not all(torch.equal(x, y) for x, y in zip(a, b)):
        raise SystemExit(f"batches differ: {what}")


def format_rows(repeats: int) -> list[list[str]]:
    """Write/read microseconds per item for each storage format, per kind of item."""
    kinds = {
        "uint8 tensor 3x224x224": [
            torch.full((3, 224, 224), i % 256, dtype=torch.uint8) for i in range(200)
        ],
        "float32 array 224x224x3": [
            np.full((224, 224, 3), i, dtype=np.float32) for i in range(100)
        ],
    }
    rows = []
    for kind, items in kinds.items():
        for name, write, read in (
            ("pickle 5, out-of-band", _records_write, _records_read),
            ("pickle 5, in band", _pickle_write, _pickle_read),
            ("torch.save", _torch_write, _torch_read),
        ):
            best_write = best_read = float("inf")
            for _ in range(repeats):
                folder = tempfile.mkdtemp(prefix="pipeloom-bench-format-")
                try:
                    start = time.perf_counter()
                    write(folder, items)
                    middle = time.perf_counter()
                    read(folder, len(items))
                    end = time.perf_counter()
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
                best_write, best_read = (
                    min(best_write, middle - start),
                    min(best_read, end - middle),
                )
            per = 1e6 / len(items)
            rows.append([kind, name, f"{best_write * per:.0f}", f"{best_read * per:.0f}"])
    return rows


def _records_write(folder: str, items: list) -> None:
    writer = RecordWriter(folder, "w", 256 << 20)
    for i, item in enumerate(items):
        writer.append(i, 0, item)
    writer.close()
    combine(folder, ["w"], sort=False)


def _records_read(folder: str, count: int) -> None:
    reader = RecordReader(folder)
    for i in range(count):
        reader.read(i)
    reader.close()


def _pickle_write(folder: str, items: list) -> None:
    with open(os.path.join(folder, "data"), "wb") as file:
        for item in items:
            pickle.dump(item, file, protocol=5)


def _pickle_read(folder: str, count: int) -> None:
    with open(os.path.join(folder, "data"), "rb") as file:
        for _ in range(count):
            pickle.load(file)


def _torch_write(folder: str, items: list) -> None:
    with open(os.path.join(folder, "data"), "wb") as file:
        for item in items:
            buffer = io.BytesIO()
            torch.save(item, buffer)
            data = buffer.getvalue()
            file.write(len(data).to_bytes(8, "little") + data)


def _torch_read(folder: str, count: int) -> None:
    with open(os.path.join(folder, "data"), "rb") as file:
        for _ in range(count):
            size = int.from_bytes(file.read(8), "little")
            torch.load(io.BytesIO(file.read(size)), weights_only=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer images, one repeat")
    parser.add_argument("--images", type=int, default=None)
    args = parser.parse_args()
    count = args.images or (96 if args.quick else 512)
    repeats = 1 if args.quick else 2
    images = tempfile.mkdtemp(prefix="pipeloom-bench-images-")
    try:
        write_images(images, count)
        rows = []
        reference, torch_rows = None, []
        for workers in (0, 2):
            rate, batches = run_torch(images, count, workers, repeats)
            reference = reference or batches
            label = f"torch DataLoader, {workers} workers"
            torch_rows.append([label, f"{rate:.0f}", f"{rate:.0f}", "1.0x"])
        for kind in ("snapshot", "in_memory_cache"):
            for workers in (0, 2):
                first, second, batches = run_pipeloom(images, count, kind, workers, repeats)
                same(batches, reference, f"{kind}, {workers} workers vs torch")
                label = f"pipeloom {kind}, {'in-process' if not workers else f'{workers} workers'}"
                rows.append([label, f"{first:.0f}", f"{second:.0f}", f"{second / first:.1f}x"])
        print_table(
            f"{count} JPEG 512x384 -> decode + resize 224x224, batch {BATCH}; items/s",
            ["loader", "epoch 1", "epoch 2", "epoch 2 / epoch 1"],
            rows + torch_rows,
        )
        print("\nepoch 2's batches equal epoch 1's and torch's (checked)")
        print_table(
            "storing one item: microseconds to write and to read back (through a file)",
            ["item", "format", "write us", "read us"],
            format_rows(repeats + 1),
        )
    finally:
        shutil.rmtree(images, ignore_errors=True)


if __name__ == "__main__":
    main()
