"""Train a small CNN with torch's DataLoader, then with ``pipeloom.compat.DataLoader``.

Run it: ``python examples/train_compat.py`` (``--short`` for a quick run).

The switch is one import: ``from pipeloom.compat import DataLoader``. With the
same seeds both runs see the same batches in the same order -- the global RNG
draws (shuffling, dropout) happen in the same sequence too -- so the losses
are bit-for-bit equal. It prints both losses and both wall times.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.data
from torch import nn

import pipeloom.compat


class SyntheticImages(torch.utils.data.Dataset):
    """Image ``i``: a 3x32x32 pattern from its own seed; its label is the pattern's class."""

    def __init__(self, size: int, classes: int = 10) -> None:
        self.size, self.classes = size, classes

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        label = index % self.classes
        image = torch.rand(3, 32, 32, generator=generator) * 0.5
        image[label % 3, :, label : label + 8] += 1.0  # a stripe that says the class
        return image, label


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.dropout = nn.Dropout(0.25)  # draws from the global RNG, between batches
        self.head = nn.Linear(32 * 8 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(self.dropout(x.flatten(1)))


def train(
    loader_class: Any, *, size: int, epochs: int, num_workers: int
) -> tuple[list[float], float]:
    """Train from the same seeds; the mean loss of each epoch and the wall time."""
    torch.manual_seed(0)  # model init, shuffling and dropout all start here
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = loader_class(
        SyntheticImages(size),
        batch_size=32,
        shuffle=True,
        num_workers=num_workers,
    )
    losses = []
    start = time.perf_counter()
    for _ in range(epochs):
        total, batches = 0.0, 0
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        losses.append(total / batches)
    elapsed = time.perf_counter() - start
    if hasattr(loader, "shutdown"):
        loader.shutdown()
    return losses, elapsed


def main(argv: list[str] | None = None) -> dict[str, tuple[list[float], float]]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--short", action="store_true", help="a small data set, for tests")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    size = 192 if args.short else 4096
    results = {}
    for name, loader_class in (
        ("torch.utils.data.DataLoader", torch.utils.data.DataLoader),
        ("pipeloom.compat.DataLoader", pipeloom.compat.DataLoader),
    ):
        losses, elapsed = train(
            loader_class, size=size, epochs=args.epochs, num_workers=args.num_workers
        )
        results[name] = (losses, elapsed)
        shown = ", ".join(f"{loss:.6f}" for loss in losses)
        print(f"{name:30s} losses per epoch: {shown}   wall time {elapsed:.2f} s")
    (theirs, _), (ours, _) = results.values()
    print("losses identical:", theirs == ours)
    return results


if __name__ == "__main__":
    main()
