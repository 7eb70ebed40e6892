"""Language-model data: mix three corpora, pack (or bucket), checkpoint, resume elsewhere.

Run it: ``python examples/lm_data.py [--mode pack|bucket] [--workers 2] [--resume-workers 3]``
(it writes its own small data set).

* "web" documents live in tar shards (one ``.txt`` member of token ids per
  document), read by worker processes; "books" and "code" are in memory.
* ``mux(weights=...)`` mixes them 2:1:1, deterministically; the epoch ends
  when the first corpus (here "web") runs out.
* ``--mode pack``: ``pack`` lays documents into rows of 128 tokens with
  segment ids and positions, then rows are batched; ``--mode bucket``:
  ``bucket_by_length`` groups documents of similar length under a token
  budget and ``PadCollate`` pads each batch to its longest.
* Halfway through the epoch the loader's state is saved with ``torch.save``;
  a new loader with another number of workers loads it and finishes the
  epoch. The example checks that the batches are exactly the uninterrupted ones.
"""

from __future__ import annotations

import argparse
import io
import pathlib
import random
import tarfile
import tempfile
from typing import Any

import torch

import pipeloom
from pipeloom.datapipes import FileLister, IterableWrapper, PadCollate
from pipeloom.reading_service import MultiProcessingReadingService

ROW = 128
SOURCES = {"web": 0, "books": 1, "code": 2}  # the first token of a document says its corpus


def fake_corpus(name: str, documents: int, seed: int) -> list[list[int]]:
    """Documents of log-normally distributed lengths; the first token names the corpus."""
    rng = random.Random(seed)
    return [
        [SOURCES[name]]
        + [rng.randint(10, 30_000) for _ in range(int(rng.lognormvariate(3.5, 0.8)))]
        for _ in range(documents)
    ]


def write_web_shards(root: pathlib.Path, shards: int = 4, per_shard: int = 50) -> None:
    for shard in range(shards):
        with tarfile.open(root / f"web-{shard:03d}.tar", "w") as tar:
            for i, document in enumerate(fake_corpus("web", per_shard, seed=shard)):
                data = " ".join(map(str, document)).encode()
                info = tarfile.TarInfo(f"{shard:03d}-{i:05d}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def parse_member(member: tuple[str, bytes]) -> list[int]:
    """A tar member ``(name, bytes)`` -> its token ids (runs in the workers)."""
    return [int(token) for token in member[1].split()]


def to_example(tokens: list[int]) -> dict[str, torch.Tensor]:
    """Next-token prediction: labels are the inputs shifted by one."""
    ids = torch.tensor(tokens)
    return {"input_ids": ids, "labels": torch.cat([ids[1:], torch.tensor([-100])])}


def document_length(example: dict[str, torch.Tensor]) -> int:
    return len(example["input_ids"])


def build_pipeline(root: str, mode: str) -> pipeloom.datapipes.IterDataPipe:
    web = (
        FileLister(root, "*.tar")
        .shuffle()
        .sharding_filter()  # workers split the shards
        .open_files("rb")
        .load_from_tar()
        .map(parse_member)
    )
    books = IterableWrapper(fake_corpus("books", 150, seed=100)).shuffle()
    code = IterableWrapper(fake_corpus("code", 150, seed=200)).shuffle()
    mixed = web.mux(books, code, weights=[2, 1, 1]).map(to_example)  # ends with "web"
    if mode == "pack":
        packed = mixed.pack(ROW, "best_fit", buffer_size=16, pad_value={"labels": -100})
        return packed.batch(4).collate()
    return mixed.bucket_by_length(
        document_length, num_buckets=8, max_tokens=4 * ROW, buffer_size=128
    ).collate(PadCollate(pad_value={"labels": -100}))


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def summarize(batches: list[dict[str, torch.Tensor]], mode: str) -> dict[str, Any]:
    """Padding fraction, and the share of documents from each corpus."""
    real = padded = 0
    documents = dict.fromkeys(SOURCES, 0)
    for batch in batches:
        ids = batch["input_ids"]
        if mode == "pack":
            mask = batch["segment_ids"] > 0
            starts = (batch["positions"] == 0) & mask
        else:
            mask = batch["attention_mask"]
            starts = torch.zeros_like(mask)
            starts[:, 0] = True
        real, padded = real + int(mask.sum()), padded + mask.numel()
        for name, first_token in SOURCES.items():
            documents[name] += int(((ids == first_token) & starts).sum())
    total = sum(documents.values())
    return {
        "batches": len(batches),
        "padding": 1 - real / padded,
        "shares": {name: count / total for name, count in documents.items()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=["pack", "bucket"], default="pack")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resume-workers", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        write_web_shards(root)
        pipe = build_pipeline(str(root), args.mode)

        with pipeloom.DataLoader(
            pipe, MultiProcessingReadingService(args.workers), seed=0
        ) as loader:
            uninterrupted = list(loader)  # epoch 0, for the check below
            loader.set_epoch(0)
            iterator = iter(loader)
            head = [next(iterator) for _ in range(len(uninterrupted) // 2)]
            torch.save(loader.state_dict(), root / "loader.pt")  # next to the model checkpoint

        # ... the job restarts, on a machine with another number of workers:
        service = MultiProcessingReadingService(args.resume_workers)
        with pipeloom.DataLoader(build_pipeline(str(root), args.mode), service) as resumed:
            resumed.load_state_dict(torch.load(root / "loader.pt", weights_only=True))
            rest = list(resumed)

    assert same(head + rest, uninterrupted), "the resumed epoch differs"
    summary = summarize(uninterrupted, args.mode)
    shares = ", ".join(f"{name} {share:.0%}" for name, share in summary["shares"].items())
    print(
        f"{args.mode}: {summary['batches']} batches, padding {summary['padding']:.1%}, "
        f"documents {shares}; resumed with {args.resume_workers} workers after "
        f"{len(head)} batches saved by {args.workers}: identical"
    )
    return summary


if __name__ == "__main__":
    main()
