"""Peak shared memory and process-tree memory vs num_workers: pipeloom vs torch.utils.data.

    python benchmarks/bench_memory.py [--workload big|tar|all] [--quick] [--plot PATH]

Two workloads, each with a consumer slower than the loaders, sampled alike (below).

**big** (the default): a map-style dataset whose item ``i`` is an 8 MiB float32
tensor filled with ``i`` (the only cost is the allocation), in batches of 16, so
one batch is 128 MiB. A consumer slower than the loader (it sleeps ``--train`` seconds per
batch, then drops it) lets every loader fill its prefetch buffers, and each
run yields ``max(10, 2 x num_workers + 6)`` batches (``--quick``: 8 and +4), more than the
``num_workers x prefetch_factor`` torch keeps in flight, so the peak is a
steady-state one. Loaders, all with prefetch_factor 2:

- torch: ``torch.utils.data.DataLoader(dataset, batch_size=16, num_workers=w)``;
- pipeloom ``strategy="classic"`` (each worker builds whole batches, like torch),
  ``"economic"`` (items go to the least-loaded item worker, batch workers
  collate, at most prefetch_factor batches in flight whatever w is) and
  ``"chunked"``, over ``SequenceWrapper(range(n)).to_iter().map(make_item).batch(16).collate()``.

**tar**: ``--shards`` (24; quick 8) WebDataset tar shards of ``--per-shard`` (200;
quick 100) one-member samples of 1 KB (deterministic bytes) in a temporary directory;
``decode`` tiles a sample's bytes into a ``--sample-kb`` (100; quick 20) KB uint8 tensor,
so one decoded shard is ~19 MiB. Batches of 32, ``prefetch_factor`` 2, a consumer that
holds each batch ``--pause`` (0.05; quick 0.02) seconds, at 2 and 4 workers
(``--workers``):

- torch: an ``IterableDataset`` that gives each worker every ``num_workers``-th shard
  (``get_worker_info()``) and streams its samples with ``tarfile``, under
  ``DataLoader(ds, batch_size=32, num_workers=w, prefetch_factor=2)``;
- pipeloom ``FileLister(d, "*.tar").sharding_filter().open_files("rb").load_from_tar()
  .webdataset().map(decode).batch(32).collate()`` under
  ``MultiProcessingReadingService(w, strategy="classic")`` and ``"chunked"`` (whose
  chunks are one shard each) and ``ThreadReadingService(w)``.

Every loader's samples are checked to be the dataset's, as a multiset (number and byte
sum of each decoded sample): the order differs between torch and pipeloom. "= shards" is
the Shmem peak in decoded shards.

A thread samples every ``--interval`` seconds, relative to a baseline taken
just before the loader is built:

- ``Shmem:`` of /proc/meminfo, system-wide shared memory. It includes
  pipeloom's memfd segments (anonymous, never in /dev/shm) and torch's
  /dev/shm-backed storages alike, so it is the figure to compare;
- the bytes used in /dev/shm (``os.statvfs``): torch's storages only;
- the loader's process tree (this process and all its descendants, via
  psutil): sum of USS (private memory), sum of PSS (shared pages split among
  their users, so it adds up) and sum of RSS (shared pages counted once per
  process that maps them; an absolute figure, not a delta).

Shmem is system-wide: other programs on the machine can add to it, so with
``--repeats`` > 1 the smallest peak over the repeats is reported. Each run's
batches are checked against the expected ``batch[:, 0]`` (the item indices)
so every loader yields identical batches (tar: the same samples). Before each
run the heap's free memory is given back (``malloc_trim``), so an in-process
loader's private memory is not hidden by the heap an earlier run left.
Throughput is batches per second of wall time (start-up included); "vs torch"
is torch's wall time over the loader's at the same num_workers (> 1: faster
than torch).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import glob
import io
import os
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.utils.data
from _common import note, print_table, quiet_torch_warnings

import pipeloom
import pipeloom.compat
from pipeloom.datapipes import FileLister, SequenceWrapper
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService

try:
    import psutil
except ImportError:  # psutil comes with the test extra; without it only Shmem and /dev/shm
    psutil = None

MIB = 1 << 20
ITEM_NUMEL = 2 * 1024 * 1024  # float32: 8 MiB per item
BATCH = 16
BATCH_BYTES = ITEM_NUMEL * 4 * BATCH  # 128 MiB
PREFETCH = 2
STRATEGIES = ("classic", "economic", "chunked")
TAR_STRATEGIES = ("classic", "chunked")
WORKLOADS = ("big", "tar", "all")


def make_item(index: int) -> torch.Tensor:
    return torch.full((ITEM_NUMEL,), float(index))


class Items(torch.utils.data.Dataset):
    """The torch side: ``dataset[i] == make_item(i)``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        return make_item(index)


def makers(n: int, workers: int, strategies: Iterable[str], compat: bool = False):
    """(name, make) for torch's loader, each pipeloom strategy and optionally the compat loader."""
    yield (
        "torch",
        lambda: torch.utils.data.DataLoader(
            Items(n), batch_size=BATCH, num_workers=workers, prefetch_factor=PREFETCH
        ),
    )
    for strategy in strategies:

        def make(strategy: str = strategy) -> pipeloom.DataLoader:
            pipe = SequenceWrapper(range(n)).to_iter().map(make_item).batch(BATCH).collate()
            service = MultiProcessingReadingService(
                workers, prefetch_factor=PREFETCH, strategy=strategy
            )
            return pipeloom.DataLoader(pipe, service, seed=0)

        yield f"pipeloom {strategy}", make
    if compat:
        yield (
            "pipeloom.compat",
            lambda: pipeloom.compat.DataLoader(
                Items(n), batch_size=BATCH, num_workers=workers, prefetch_factor=PREFETCH
            ),
        )


# --- sampling -----------------------------------------------------------------------------


def shmem_bytes() -> int:
    """System-wide ``Shmem:`` of /proc/meminfo (tmpfs, /dev/shm, memfd, SysV), in bytes."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Shmem: line in /proc/meminfo")


def dev_shm_bytes() -> int:
    stat = os.statvfs("/dev/shm")
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def tree_memory() -> tuple[int, int, int | None] | None:
    """(sum of USS, sum of RSS, sum of PSS or None) over this process and its descendants."""
    if psutil is None:
        return None
    me = psutil.Process()
    uss = rss = pss = 0
    has_pss = True
    for process in [me, *me.children(recursive=True)]:
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # a worker that just exited
        uss += info.uss
        rss += info.rss
        if hasattr(info, "pss"):
            pss += info.pss
        else:
            has_pss = False
    return uss, rss, pss if has_pss else None


@dataclass
class Peaks:
    shmem: int = 0
    dev_shm: int = 0
    uss: int = 0
    pss: int | None = None
    rss: int = 0
    samples: int = 0


class Sampler:
    """Samples memory in a thread until stopped; keeps the peaks above the baseline."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.stop_event = threading.Event()
        self.base_shmem = shmem_bytes()
        self.base_dev_shm = dev_shm_bytes()
        tree = tree_memory()
        self.base_uss = tree[0] if tree else 0
        self.base_pss = tree[2] if tree and tree[2] is not None else 0
        self.peaks = Peaks()
        self.thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_event.set()
        self.thread.join()

    def sample(self) -> None:
        p = self.peaks
        p.shmem = max(p.shmem, shmem_bytes() - self.base_shmem)
        p.dev_shm = max(p.dev_shm, dev_shm_bytes() - self.base_dev_shm)
        tree = tree_memory()
        if tree is not None:
            uss, rss, pss = tree
            p.uss = max(p.uss, uss - self.base_uss)
            p.rss = max(p.rss, rss)
            if pss is not None:
                p.pss = max(p.pss or 0, pss - self.base_pss)
        p.samples += 1

    def _run(self) -> None:
        while True:
            self.sample()
            if self.stop_event.wait(self.interval):
                break


# --- one run ------------------------------------------------------------------------------


@dataclass
class Result:
    wall: float
    batches: int
    peaks: Peaks
    leftover_shmem: int  # Shmem above the baseline after the loader is shut down and collected
    checksums: list[list[Any]] = field(default_factory=list)


def steady(train: float) -> Callable[[int], float]:
    """A consumer that holds every batch ``train`` seconds."""
    return lambda index: train


def trim_heap() -> None:
    """Give the heap's free memory back to the system (glibc's ``malloc_trim``), if there is one.

    Samples smaller than glibc's mmap threshold live in the heap, which keeps what the
    previous run freed: a loader working in this process would reuse it unseen by USS.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc


def first_column(batch: torch.Tensor) -> list[float]:
    """The big workload's digest of a batch: its items' indices."""
    return batch[:, 0].tolist()


def run_once(
    make_loader: Callable[[], Any],
    pause: Callable[[int], float],
    interval: float,
    digest: Callable[[Any], list[Any]] = first_column,
) -> Result:
    """One epoch on a fresh loader, holding batch ``i`` for ``pause(i)`` seconds, sampled.

    ``digest(batch)`` is kept per batch (in ``Result.checksums``) for the caller to check.
    """
    gc.collect()
    trim_heap()  # else the heap freed by earlier runs hides this one's private memory
    time.sleep(0.2)  # let the previous run's segments and /dev/shm files go
    checksums = []
    with Sampler(interval) as sampler:
        start = time.perf_counter()
        loader = make_loader()
        iterator = iter(loader)
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                break
            checksums.append(digest(batch))
            time.sleep(pause(len(checksums) - 1))  # "train" on the batch, holding it
            del batch  # drop it before asking for the next one, for every loader alike
        wall = time.perf_counter() - start
        sampler.sample()
    shutdown = getattr(loader, "shutdown", None)
    if shutdown is not None:
        shutdown()
    del iterator, loader
    gc.collect()
    time.sleep(0.2)
    leftover = shmem_bytes() - sampler.base_shmem
    return Result(wall, len(checksums), sampler.peaks, leftover, checksums)


def check(name: str, workers: int, result: Result, n: int) -> None:
    expected = [
        [float(i) for i in range(start, min(start + BATCH, n))] for start in range(0, n, BATCH)
    ]
    if result.checksums != expected:
        raise AssertionError(f"{name} with {workers} workers yields different batches than torch")


def best(results: list[Result]) -> Result:
    """The repeat with the smallest Shmem peak (Shmem is system-wide: others only add)."""
    return min(results, key=lambda r: r.peaks.shmem)


def mib(nbytes: int | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / MIB:.0f}"


# --- plot ---------------------------------------------------------------------------------


def plot(path: str, series: dict[str, dict[int, float]], title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"\nmatplotlib is not installed (pip install matplotlib): no plot written to {path}")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in series.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=name)
    ax.set_xscale("log", base=2)
    workers = sorted({x for points in series.values() for x in points})
    ax.set_xticks(workers)
    ax.set_xticklabels([str(x) for x in workers])
    ax.set_xlabel("num_workers")
    ax.set_ylabel("peak shared memory (MiB, Shmem delta)")
    ax.set_title(title, fontsize=10)
    secondary = ax.secondary_yaxis(
        "right", functions=(lambda m: m * MIB / BATCH_BYTES, lambda b: b * BATCH_BYTES / MIB)
    )
    secondary.set_ylabel(f"in batches of {BATCH_BYTES // MIB} MiB")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"\nplot written to {path}")


# --- the table ----------------------------------------------------------------------------

MEMORY_NOTE = (
    "(USS and PSS: sum over the process tree above the pre-loader baseline; RSS: absolute"
    " sum, counting a shared page once per process mapping it. 'Shmem after': Shmem above the"
    " baseline once the loader is shut down and collected.)"
)


def memory_header(unit: str = "batches") -> list[str]:
    """The columns of :func:`memory_row`; ``unit`` names what "peak Shmem" is also given in."""
    header = ["loader", "workers", "batches", "peak Shmem MiB", f"= {unit}", "peak /dev/shm MiB"]
    if psutil is not None:
        header += ["peak tree USS MiB", "peak tree PSS MiB", "peak tree RSS MiB"]
    return header + ["Shmem after MiB", "wall s", "batches/s", "vs torch"]


def memory_rows(
    worker_counts: Iterable[int],
    loaders_for: Callable[[int, int], Iterable[tuple[str, Callable[[], Any]]]],
    pause: Callable[[int], float],
    repeats: int,
    interval: float,
    quick: bool,
    batches_for: Callable[[int], int] | None = None,
) -> tuple[list[list[Any]], dict[str, dict[int, float]]]:
    """Rows of :func:`memory_header` and the Shmem peaks per loader and num_workers.

    ``loaders_for(n, workers)`` gives (name, make) pairs, torch's first and named "torch";
    ``batches_for(workers)`` the batches per run (default: enough for a steady state).
    """
    rows = []
    series: dict[str, dict[int, float]] = {}
    for workers in worker_counts:
        # Enough batches to fill every loader's buffers (w x prefetch) and then some.
        extra, least = (4, 8) if quick else (6, 10)
        n_batches = max(least, workers * PREFETCH + extra)
        if batches_for is not None:
            n_batches = batches_for(workers)
        n = n_batches * BATCH
        loaders = dict(loaders_for(n, workers))
        runs: dict[str, list[Result]] = {name: [] for name in loaders}
        for _ in range(repeats):  # round-robin, so drift in machine load hits every loader alike
            for name, make in loaders.items():
                result = run_once(make, pause, interval)
                check(name, workers, result, n)
                result.checksums = []
                runs[name].append(result)
        torch_wall = min(r.wall for r in runs["torch"])
        for name, results in runs.items():
            series.setdefault(name, {})[workers] = best(results).peaks.shmem / MIB
            rows.append(memory_row(name, workers, results, torch_wall, BATCH_BYTES))
    return rows, series


def memory_row(
    name: str, workers: int, results: list[Result], torch_wall: float, unit_bytes: int
) -> list[Any]:
    """A row of :func:`memory_header`: the least Shmem peak of ``results``, their best wall."""
    r = best(results)
    wall = min(x.wall for x in results)
    p = r.peaks
    row: list[Any] = [
        name,
        workers,
        r.batches,
        mib(p.shmem),
        f"{p.shmem / unit_bytes:.1f}",
        mib(p.dev_shm),
    ]
    if psutil is not None:
        row += [mib(p.uss), mib(p.pss), mib(p.rss)]
    row += [
        mib(r.leftover_shmem),
        f"{wall:.2f}",
        f"{r.batches / wall:.2f}",
        "" if name == "torch" else f"{torch_wall / wall:.2f}x",
    ]
    return row


# --- the tar workload ---------------------------------------------------------------------

TAR_BATCH = 32
PAYLOAD_BYTES = 1024  # a sample's bytes in its shard; decode tiles them to ``size`` bytes


def write_shards(root: str, shards: int, per_shard: int) -> list[bytes]:
    """``shards`` tar files of ``per_shard`` one-member samples in ``root``; the payloads.

    Sample ``k`` (0, 1, ... over the shards in order) is ``<shard>_<index>.bin``: the
    little-endian int32 ``k`` and ``PAYLOAD_BYTES - 4`` bytes of a seeded stream.
    """
    rng = np.random.default_rng(0)
    payloads: list[bytes] = []
    for shard in range(shards):
        with tarfile.open(os.path.join(root, f"shard-{shard:04d}.tar"), "w") as tar:
            for index in range(per_shard):
                filler = rng.integers(0, 256, PAYLOAD_BYTES - 4, dtype=np.uint8).tobytes()
                payload = len(payloads).to_bytes(4, "little") + filler
                payloads.append(payload)
                info = tarfile.TarInfo(f"{shard:04d}_{index:05d}.bin")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return payloads


@dataclass(frozen=True)
class Decode:
    """A WebDataset sample → a ``size``-byte uint8 tensor: its payload tiled (the "decoding")."""

    size: int

    def __call__(self, sample: dict[str, Any]) -> torch.Tensor:
        return torch.from_numpy(np.resize(np.frombuffer(sample["bin"], dtype=np.uint8), self.size))


def sample_digests(batch: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(sample number, size, sums of the first and last KB) per row of decoded samples.

    Small reads only: summing whole batches made the main process's heap grow by
    gigabytes (glibc kept the freed int64 copies), which the USS columns then showed.
    """
    numbers = batch[:, :4].contiguous().view(torch.int32).flatten().tolist()
    heads = batch[:, :PAYLOAD_BYTES].sum(dim=1, dtype=torch.int64).tolist()
    tails = batch[:, -PAYLOAD_BYTES:].sum(dim=1, dtype=torch.int64).tolist()
    size = batch.shape[1]
    return [(n, size, h, t) for n, h, t in zip(numbers, heads, tails, strict=True)]


class TarShards(torch.utils.data.IterableDataset):
    """The torch side: each worker streams its share of the shards with ``tarfile``."""

    def __init__(self, shards: list[str], decode: Decode) -> None:
        self.shards = shards
        self.decode = decode

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = torch.utils.data.get_worker_info()
        mine = self.shards if info is None else self.shards[info.id :: info.num_workers]
        for path in mine:
            with tarfile.open(path, "r|") as tar:  # streamed, as a WebDataset reader does
                for member in tar:
                    handle = tar.extractfile(member)
                    if handle is not None:  # one member per sample in these shards
                        yield self.decode({"__key__": member.name, "bin": handle.read()})


def tar_makers(root: str, workers: int, decode: Decode) -> Iterator[tuple[str, Callable[[], Any]]]:
    """(name, make) for torch's loader and pipeloom's classic, chunked and threads."""
    shards = sorted(glob.glob(os.path.join(root, "*.tar")))
    yield (
        "torch",
        lambda: torch.utils.data.DataLoader(
            TarShards(shards, decode),
            batch_size=TAR_BATCH,
            num_workers=workers,
            prefetch_factor=PREFETCH,
        ),
    )

    def pipe() -> Any:
        return (
            FileLister(root, "*.tar")
            .sharding_filter()
            .open_files("rb")
            .load_from_tar()
            .webdataset()
            .map(decode)
            .batch(TAR_BATCH)
            .collate()
        )

    for strategy in TAR_STRATEGIES:

        def make(strategy: str = strategy) -> pipeloom.DataLoader:
            service = MultiProcessingReadingService(
                workers, prefetch_factor=PREFETCH, strategy=strategy
            )
            return pipeloom.DataLoader(pipe(), service, seed=0)

        yield f"pipeloom {strategy}", make
    yield (
        "pipeloom threads",
        lambda: pipeloom.DataLoader(
            pipe(), ThreadReadingService(workers, prefetch_factor=PREFETCH)
        ),
    )


def tar_rows(
    worker_counts: Iterable[int],
    shards: int,
    per_shard: int,
    decode: Decode,
    pause: float,
    repeats: int,
    interval: float,
) -> list[list[Any]]:
    """Rows of :func:`memory_header` for the tar workload; every loader's samples checked."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_memory_tar-") as root:
        payloads = write_shards(root, shards, per_shard)
        expected = sorted(sample_digests(decode({"bin": p})[None])[0] for p in payloads)
        del payloads
        for workers in worker_counts:
            loaders = dict(tar_makers(root, workers, decode))
            runs: dict[str, list[Result]] = {name: [] for name in loaders}
            for _ in range(repeats):  # round-robin, as memory_rows
                for name, make in loaders.items():
                    result = run_once(make, steady(pause), interval, digest=sample_digests)
                    got = sorted(d for batch in result.checksums for d in batch)
                    if got != expected:
                        raise AssertionError(
                            f"{name} with {workers} workers yields {len(got)} samples, not the "
                            f"{len(expected)} of the shards (or their bytes differ)"
                        )
                    result.checksums = []
                    runs[name].append(result)
            torch_wall = min(r.wall for r in runs["torch"])
            rows += [
                memory_row(name, workers, results, torch_wall, per_shard * decode.size)
                for name, results in runs.items()
            ]
    return rows


# --- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> list[list[Any]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="big",
        help="big: 8 MiB items in 128 MiB batches (the default); tar: WebDataset shards; all: both",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer workers and batches, smaller samples (< 1 min)"
    )
    parser.add_argument("--plot", metavar="PATH", help="big: a PNG of peak Shmem vs num_workers")
    parser.add_argument("--train", type=float, help="big: consumer s per batch (0.4; quick 0.25)")
    parser.add_argument("--interval", type=float, default=0.01, help="sampling period, seconds")
    parser.add_argument("--repeats", type=int, help="runs per case; the smallest peak is kept")
    parser.add_argument("--no-chunked", action="store_true", help="big: skip strategy='chunked'")
    parser.add_argument("--shards", type=int, help="tar: shards (24; quick 8)")
    parser.add_argument("--per-shard", type=int, help="tar: samples per shard (200; quick 100)")
    parser.add_argument("--sample-kb", type=int, help="tar: KB per decoded sample (100; quick 20)")
    parser.add_argument("--pause", type=float, help="tar: consumer s per batch (0.05; quick 0.02)")
    parser.add_argument("--workers", type=int, nargs="+", help="tar: num_workers to run (2 4)")
    args = parser.parse_args(argv)
    quiet_torch_warnings()
    if psutil is None:
        note("psutil is not installed (pip install psutil): no process-tree columns")
    rows = []
    if args.workload in ("big", "all"):
        rows += big_workload(args)
    if args.workload in ("tar", "all"):
        rows += tar_workload(args)
    return rows


def big_workload(args: argparse.Namespace) -> list[list[Any]]:
    """The default workload: 8 MiB items, 128 MiB batches, every strategy."""
    if args.quick:
        worker_counts, repeats, train = (1, 4), 1, 0.25
        args.no_chunked = True  # keeps --quick under a minute on a busy 2-core machine
    else:
        worker_counts, repeats, train = (1, 2, 4, 8), 2, 0.4
    repeats = args.repeats or repeats
    # An 8 MiB item costs ~6 ms to allocate, a batch ~0.1 s to stack and as much again to move
    # through shared memory: the consumer must be slower than that, on a busy 2-core machine too.
    train = train if args.train is None else args.train
    strategies = [s for s in STRATEGIES if not (args.no_chunked and s == "chunked")]
    rows, series = memory_rows(
        worker_counts,
        lambda n, workers: makers(n, workers, strategies),
        steady(train),
        repeats,
        args.interval,
        quick=args.quick,
    )
    title = (
        f"peak memory above baseline: items of {ITEM_NUMEL * 4 // MIB} MiB, batch {BATCH} "
        f"(= {BATCH_BYTES // MIB} MiB), prefetch_factor {PREFETCH}, consumer {train} s per "
        f"batch, sampled every {args.interval * 1e3:g} ms, least Shmem peak of {repeats} run(s)"
    )
    print_table(title, memory_header(), rows)
    note(MEMORY_NOTE)
    if args.plot:
        plot(
            args.plot,
            series,
            f"peak shared memory vs num_workers (batch = {BATCH_BYTES // MIB} MiB, "
            f"prefetch_factor {PREFETCH})",
        )
    return rows


def tar_workload(args: argparse.Namespace) -> list[list[Any]]:
    """WebDataset tar shards decoded into big samples: torch, classic, chunked, threads."""
    shards, per_shard, sample_kb, pause, repeats = (
        (8, 100, 20, 0.02, 1) if args.quick else (24, 200, 100, 0.05, 2)
    )
    shards = args.shards or shards
    per_shard = args.per_shard or per_shard
    decode = Decode(1000 * (args.sample_kb or sample_kb))
    pause = pause if args.pause is None else args.pause
    repeats = args.repeats or repeats
    worker_counts = tuple(args.workers or (2, 4))
    rows = tar_rows(worker_counts, shards, per_shard, decode, pause, repeats, args.interval)
    shard_mib = per_shard * decode.size / MIB
    print_table(
        f"tar shards, peak memory above baseline: {shards} shards x {per_shard} samples, each "
        f"decoded to {decode.size // 1000} KB (a decoded shard = {shard_mib:.1f} MiB, the "
        f"dataset {shards * shard_mib:.0f} MiB), batch {TAR_BATCH}, prefetch_factor {PREFETCH}, "
        f"consumer {pause:g} s per batch, sampled every {args.interval * 1e3:g} ms, least Shmem "
        f"peak of {repeats} run(s)",
        memory_header("shards"),
        rows,
    )
    note(MEMORY_NOTE + " '= shards': the Shmem peak in decoded shards.")
    return rows


if __name__ == "__main__":
    main()
