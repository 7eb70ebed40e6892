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
"""

from __future__ import annotations

import argparse
import os
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
    finally:
        shutil.rmtree(images, ignore_errors=True)


if __name__ == "__main__":
    main()
