"""A first pipeline: CSV shards on disk -> shuffled, batched tensors.

Run it: ``python examples/first_pipeline.py`` (it writes its own small data set).

It lists files, shuffles them, opens and parses them, turns rows into tensors,
shuffles rows through a buffer, batches and collates, and runs on a
``DataLoader`` with a seed, so every run prints the same batches.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile

import torch

import pipeloom
from pipeloom.datapipes import FileLister


def write_shards(root: pathlib.Path, shards: int = 4, rows: int = 25) -> None:
    """Write ``shards`` CSV files of ``rows`` (id, x, y, label) rows each."""
    generator = torch.Generator().manual_seed(0)
    for shard in range(shards):
        lines = ["id,x,y,label"]
        for row in range(rows):
            x, y = torch.rand(2, generator=generator).tolist()
            lines.append(f"{shard * rows + row},{x:.4f},{y:.4f},{int(x + y > 1)}")
        (root / f"shard-{shard:02d}.csv").write_text("\n".join(lines) + "\n")


def to_sample(row: dict[str, str]) -> dict[str, torch.Tensor]:
    """One CSV row -> a dict of tensors."""
    return {
        "id": torch.tensor(int(row["id"])),
        "features": torch.tensor([float(row["x"]), float(row["y"])]),
        "label": torch.tensor(int(row["label"])),
    }


def build_pipeline(root: str, batch_size: int = 16) -> pipeloom.datapipes.IterDataPipe:
    """The recipe: a graph of small blocks, nothing runs yet."""
    return (
        FileLister(root, masks="*.csv")
        .shuffle()  # shuffle the shard order
        .sharding_filter()  # workers would split here
        .open_files(mode="r")
        .parse_csv(as_dict=True)
        .map(to_sample)
        .shuffle(buffer_size=64)  # shuffle rows across shards
        .batch(batch_size)
        .collate()
    )


def main(argv: list[str] | None = None) -> list[list[int]]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    seen: list[list[int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        write_shards(pathlib.Path(tmp))
        with pipeloom.DataLoader(build_pipeline(tmp), seed=0) as loader:
            for epoch in range(args.epochs):
                for step, batch in enumerate(loader):
                    ids = batch["id"].tolist()
                    seen.append(ids)
                    print(
                        f"epoch {epoch} batch {step}: features {tuple(batch['features'].shape)}"
                        f" labels {batch['label'].tolist()[:6]}... first ids {ids[:4]}"
                    )
    return seen


if __name__ == "__main__":
    main()
