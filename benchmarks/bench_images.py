"""JPEGs: decode, random crop, batch -- pipeloom vs torch.utils.data.DataLoader, one run.

    python benchmarks/bench_images.py [--quick] [--workers 2 4] [--repeats 3] [--only classic ...]

The most common real pipeline (issue #16): 1,600 JPEGs of 256x256 (random-ish
content, written deterministically with Pillow to a temporary directory in an
ImageFolder layout, one folder per class, 16 classes), decoded with Pillow,
randomly cropped to 224x224, turned into a ``uint8`` CHW tensor, batches of 32
(images and labels collated), at 0, 2 and 4 workers. Loaders:

- torch: ``torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True,
  num_workers=w)`` over an ImageFolder-style map dataset (the crop offset
  from ``torch.randint``, as torchvision's transforms draw it);
- ``pipeloom.compat.DataLoader`` with the same arguments over the same dataset;
- native files: ``FileLister(root, "*.jpg", recursive=True).shuffle()
  .sharding_filter().open_files("rb").map(decode).batch(32).collate()``
  (the crop offset from ``pipeloom.item_rng()``), in-process and under
  classic / economic / chunked processes and ``ThreadReadingService(w)``;
- native tar: the same images in 16 WebDataset shards written with ``tarfile``,
  ``FileLister(shards, "*.tar").shuffle().sharding_filter().open_files("rb")
  .load_from_tar().webdataset().map(decode).batch(32).collate()``, same services.

Every run builds a fresh loader and reads one epoch; the median of the repeats
is reported: items/s and its ratio to torch's at the same worker count, the time
to the first batch (from building the loader), and the training process's own
CPU time per batch -- ``time.process_time()`` from building the loader to the
last batch: every thread of the main process (so worker *threads* count, as
they load the training process), never worker processes (``RUSAGE_SELF``
excludes children) -- and the part of it spent on the training loop's own
thread (``time.thread_time()``). ``loader.placement()`` is printed once per
native configuration, to show where ``batch`` and ``collate`` run.

Batches are checked identical across the services of each native family (the
crops come from the item's own RNG). Pillow is optional: without it the
benchmark prints a message and exits.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tarfile
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.utils.data
from _common import Clock, Epoch, note, print_table, quiet_torch_warnings, rate, run_epoch, shutdown

import pipeloom
import pipeloom.compat
from pipeloom.datapipes import FileLister
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)

try:
    from PIL import Image
except ImportError:  # Pillow is an optional dependency
    Image = None

SIZE = 256
CROP = 224
BATCH = 32
CLASSES = 16
SHARDS = 16
STRATEGIES = ("classic", "economic", "chunked")


# --- data ----------------------------------------------------------------------------------


def write_images(root: str, count: int) -> tuple[str, str]:
    """``count`` JPEGs in ``root/images/<class>/``, the same in 16 tar shards; both dirs."""
    images, shards = os.path.join(root, "images"), os.path.join(root, "shards")
    for label in range(CLASSES):
        os.makedirs(os.path.join(images, f"{label:02d}"))
    os.makedirs(shards)
    rng = np.random.default_rng(0)
    encoded = []
    for i in range(count):
        # smooth colour fields plus noise: compresses like a photo, not like white noise
        coarse = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).resize(
            (SIZE, SIZE), Image.BILINEAR
        )
        noise = rng.integers(-24, 25, (SIZE, SIZE, 3))
        pixels = np.clip(np.asarray(coarse, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        label = i % CLASSES
        with open(os.path.join(images, f"{label:02d}", f"{i:05d}.jpg"), "wb") as out:
            out.write(buffer.getvalue())
        encoded.append((i, label, buffer.getvalue()))
    order = rng.permutation(count)  # shards hold a shuffled mix of classes, as writers do
    per_shard = -(-count // SHARDS)
    for shard in range(SHARDS):
        with tarfile.open(os.path.join(shards, f"train-{shard:04d}.tar"), "w") as tar:
            for position in order[shard * per_shard : (shard + 1) * per_shard]:
                i, label, data = encoded[position]
                for ext, payload in ((".jpg", data), (".cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{i:05d}{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
    return images, shards


def crop_to_tensor(image: Any, x: int, y: int) -> torch.Tensor:
    """The ``CROP`` x ``CROP`` window at ``(x, y)`` as a uint8 CHW tensor."""
    window = np.array(image.crop((x, y, x + CROP, y + CROP)))
    return torch.from_numpy(window).permute(2, 0, 1).contiguous()


def label_of(path: str) -> int:
    return int(os.path.basename(os.path.dirname(path)))


class ImageFolderLike(torch.utils.data.Dataset):
    """torchvision's ImageFolder, in short: (path, class) pairs, Pillow, a random crop."""

    def __init__(self, root: str) -> None:
        self.samples = [
            (os.path.join(folder, name), int(os.path.basename(folder)))
            for folder, _, names in sorted(os.walk(root))
            for name in sorted(names)
            if name.endswith(".jpg")
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with open(path, "rb") as handle:
            image = Image.open(handle).convert("RGB")
        x, y = torch.randint(0, SIZE - CROP + 1, (2,)).tolist()
        return crop_to_tensor(image, x, y), label


def decode_file(path_and_stream: tuple[str, Any]) -> tuple[torch.Tensor, int]:
    path, stream = path_and_stream
    with stream:
        image = Image.open(stream).convert("RGB")
    x, y = pipeloom.item_rng().integers(0, SIZE - CROP + 1, size=2).tolist()
    return crop_to_tensor(image, x, y), label_of(path)


def decode_sample(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    image = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
    x, y = pipeloom.item_rng().integers(0, SIZE - CROP + 1, size=2).tolist()
    return crop_to_tensor(image, x, y), int(sample["cls"])


# --- loaders -------------------------------------------------------------------------------


def files_pipe(images: str) -> Any:
    return (
        FileLister(images, "*.jpg", recursive=True)
        .shuffle()
        .sharding_filter()
        .open_files("rb")
        .map(decode_file)
        .batch(BATCH)
        .collate()
    )


def tar_pipe(shards: str) -> Any:
    return (
        FileLister(shards, "*.tar")
        .shuffle()
        .sharding_filter()
        .open_files("rb")
        .load_from_tar()
        .webdataset()
        .map(decode_sample)
        .batch(BATCH)
        .collate()
    )


def services(workers: int, only: tuple[str, ...] = ()) -> list[tuple[str, Callable[[], Any]]]:
    if workers == 0:
        return [("in-process", InProcessReadingService)]
    made: list[tuple[str, Callable[[], Any]]] = [
        (s, lambda s=s: MultiProcessingReadingService(workers, strategy=s)) for s in STRATEGIES
    ]
    made.append(("threads", lambda: ThreadReadingService(workers)))
    return [(name, make) for name, make in made if not only or name in only]


def loaders(
    dataset: ImageFolderLike, images: str, shards: str, workers: int, only: tuple[str, ...] = ()
):
    """(family, label, make) for every loader at ``workers``; family groups identical outputs."""

    def torch_style(cls: Any) -> Callable[[], Any]:
        return lambda: cls(
            dataset,
            batch_size=BATCH,
            shuffle=True,
            num_workers=workers,
            generator=torch.Generator().manual_seed(0),
        )

    yield "torch", "torch DataLoader, ImageFolder-style", torch_style(torch.utils.data.DataLoader)
    if not only or "compat" in only:
        yield (
            "compat",
            "pipeloom.compat.DataLoader, same dataset",
            torch_style(pipeloom.compat.DataLoader),
        )
    for family, pipe in (("files", files_pipe), ("tar", tar_pipe)):
        root = images if family == "files" else shards
        for name, service in services(workers, only):
            yield (
                family,
                f"native {family}, {name}",
                lambda pipe=pipe, root=root, service=service: pipeloom.DataLoader(
                    pipe(root), service(), seed=0
                ),
            )


def labels_of(batch: Any) -> int:
    return len(batch[1])


def one_run(make: Callable[[], Any]) -> tuple[Epoch, list[Any], str | None]:
    torch.manual_seed(0)  # torch.randint in the main process (0 workers) starts alike every run
    checks: list[Any] = []

    def visit(batch: Any) -> None:
        checks.append((batch[1].tolist(), int(batch[0][:, :, :4, :4].sum())))

    clock = Clock.now()
    loader = make()
    try:
        epoch = run_epoch(loader, since=clock, visit=visit, size=labels_of)
        placement = str(loader.placement()) if isinstance(loader, pipeloom.DataLoader) else None
    finally:
        shutdown(loader)
    return epoch, checks, placement


def bench(
    count: int, worker_counts: tuple[int, ...], repeats: int, only: tuple[str, ...] = ()
) -> None:
    rows: list[list[Any]] = []
    placements: dict[str, str] = {}
    refused: dict[str, str] = {}  # configurations pipeloom does not run (yet), and why
    references: dict[str, list[Any]] = {}  # per family: its first run (in-process when run)
    with tempfile.TemporaryDirectory(prefix="pipeloom-bench-images-") as root:
        images, shards = write_images(root, count)
        dataset = ImageFolderLike(images)
        for workers in worker_counts:
            makers = list(loaders(dataset, images, shards, workers, only))
            runs: dict[str, list[Epoch]] = {label: [] for _, label, _ in makers}
            same: dict[str, str] = {}
            for _ in range(repeats):  # round-robin, so drift in machine load hits all alike
                for family, label, make in makers:
                    if label in refused:
                        continue
                    try:
                        epoch, check, placement = one_run(make)
                    except ValueError as error:  # a strategy that refuses this pipeline
                        refused[label] = f"{type(error).__name__}: {error}"
                        continue
                    if epoch.items != count:
                        raise AssertionError(f"{label} read {epoch.items} of {count} images")
                    # torch's crops depend on its worker count (worker seeds): compat is
                    # compared with torch at the same count; native runs with in-process
                    key = f"torch x{workers}" if family in ("torch", "compat") else family
                    reference = references.setdefault(key, check)
                    if family != "torch" and same.get(label) != "no":
                        same[label] = "yes" if check == reference else "no"
                    if placement is not None:
                        placements.setdefault(f"{label}, {workers} workers", placement)
                    runs[label].append(epoch)
            torch_speed = statistics.median(e.items_per_s for e in runs[makers[0][1]])
            torch_cpu = statistics.median(e.cpu / e.batches for e in runs[makers[0][1]])
            for _, label, _ in makers:
                epochs = runs[label]
                if not epochs:
                    rows.append([workers, label, "refused (see below)"] + [""] * 6)
                    continue
                speed = statistics.median(e.items_per_s for e in epochs)
                cpu = statistics.median(e.cpu / e.batches for e in epochs)
                rows.append(
                    [
                        workers,
                        label,
                        rate(speed),
                        f"{speed / torch_speed:.2f}x",
                        f"{statistics.median(e.first for e in epochs) * 1e3:.0f}",
                        f"{cpu * 1e3:.1f}",
                        f"{cpu / torch_cpu:.2f}x",
                        f"{statistics.median(e.thread_cpu / e.batches for e in epochs) * 1e3:.1f}",
                        same.get(label, ""),
                    ]
                )
    print_table(
        f"JPEG pipeline: {count} images {SIZE}x{SIZE}, Pillow decode, random crop {CROP}, "
        f"batch {BATCH}, fresh loader per run (start-up included), median of {repeats}",
        [
            "workers",
            "loader",
            "items/s",
            "vs torch",
            "first batch ms",
            "main-process CPU ms/batch",
            "CPU vs torch",
            "main thread CPU ms/batch",
            "same batches",
        ],
        rows,
    )
    note(
        "main-process CPU: time.process_time() of the training process (all its threads, no "
        "worker process) from building the loader to the last batch, per batch; 'CPU vs torch' "
        "< 1 means the training process does less work than under torch's loader. main thread: "
        "time.thread_time() of the thread iterating the loader."
    )
    for label, why in refused.items():
        note(f"{label}: refused the pipeline: {why}")
    note(
        "same batches: identical to the family's first run -- native files and tar: to their "
        "in-process run (the crops come from pipeloom.item_rng(), so they must match under "
        "every service); compat: to torch's loader at the same worker count, with the same "
        "generator and torch.manual_seed."
    )
    note(
        "placement of each native configuration:\n\n```\n"
        + "\n".join(f"{name}:\n{text}\n" for name, text in placements.items())
        + "```"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="192 images, 0 and 2 workers, 1 run")
    parser.add_argument(
        "--workers", type=int, nargs="+", help="worker counts (default 0 2 4; --quick: 0 2)"
    )
    parser.add_argument("--repeats", type=int, help="runs per loader (default 3; --quick: 1)")
    parser.add_argument(
        "--only",
        nargs="+",
        default=(),
        choices=(*STRATEGIES, "threads", "compat"),
        help="run only these pipeloom services beside torch (default: all)",
    )
    args = parser.parse_args(argv)
    if Image is None:
        note("bench_images skipped: Pillow is not installed (pip install pillow)")
        return
    quiet_torch_warnings()
    count, workers, repeats = (192, (0, 2), 1) if args.quick else (1600, (0, 2, 4), 3)
    bench(
        count=count,
        worker_counts=tuple(args.workers or workers),
        repeats=args.repeats or repeats,
        only=tuple(args.only),
    )


if __name__ == "__main__":
    main()
