"""Where does the time go? A pipeline whose decoding is the slow part, profiled.

Profile it from the command line (from the repository's root)::

    python -m pipeloom profile examples.profile_decode:build --workers 2 --batches 120

or run this file, which reads it with statistics on and prints them:
``python examples/profile_decode.py``. Items are synthetic "encoded images"
(bytes made from the item's number); ``decode`` turns one into a normalised,
blurred 1x96x96 tensor, on purpose far slower than the rest.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import pipeloom
from pipeloom.datapipes import IterableWrapper, IterDataPipe
from pipeloom.reading_service import MultiProcessingReadingService

SIDE = 96
_BLUR = torch.full((1, 1, 5, 5), 1 / 25)


def fetch(index: int) -> tuple[int, bytes]:
    """A stand-in for reading a record: cheap."""
    generator = torch.Generator().manual_seed(index)
    pixels = torch.randint(0, 256, (SIDE * SIDE,), dtype=torch.uint8, generator=generator)
    return index % 10, pixels.numpy().tobytes()


def decode(record: tuple[int, bytes]) -> tuple[torch.Tensor, int]:
    """The slow part: bytes -> a normalised, blurred image (several passes, on purpose)."""
    label, data = record
    image = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(1, 1, SIDE, SIDE).float()
    for _ in range(8):
        image = F.conv2d(image, _BLUR, padding=2)
    image = (image - image.mean()) / (image.std() + 1e-6)
    return image[0], label


def collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*batch, strict=True)
    return torch.stack(images), torch.tensor(labels)


def build(items: int = 4096) -> IterDataPipe:
    """The pipeline ``python -m pipeloom profile`` calls."""
    return (
        IterableWrapper(range(items))
        .shuffle()
        .sharding_filter()
        .map(fetch)
        .map(decode)
        .batch(16)
        .collate(collate)
    )


def main(argv: list[str] | None = None) -> pipeloom.stats.LoaderStats:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    service = MultiProcessingReadingService(args.workers)
    with pipeloom.DataLoader(build(args.items), service, seed=0, stats=True) as loader:
        for _images, _labels in loader:
            pass  # the training step would go here
    stats = loader.stats()
    print(stats)
    return stats


if __name__ == "__main__":
    main()
