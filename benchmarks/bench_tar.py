"""Tar shards end to end: pipeloom vs a torch map-style Dataset, one run.

    python benchmarks/bench_tar.py [--quick]

Writes N shards of M samples (a float32 3x64x64 ``.npy`` array and a ``.cls``
label each) to a temporary directory, then reads one epoch

* with pipeloom, in-process: list → open → load_from_tar → webdataset →
  decode → map to (array, label) → batch(32) → collate;
* with ``torch.utils.data.DataLoader(batch_size=32, num_workers=0)`` over a
  ``Dataset`` whose index of (shard, offset, size) is built once with
  ``tarfile`` and whose ``__getitem__`` seeks, reads and decodes each member.

Both produce the same batches (checked). Higher samples/s is better; the
ratio is pipeloom's throughput over torch's (> 1 means pipeloom is faster).
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
import tempfile

import numpy as np
import torch
import torch.utils.data
from _common import best_time, consume, note, print_table

from pipeloom.datapipes import FileLister

BATCH = 32


def write_shards(root: str, shards: int, per_shard: int) -> None:
    rng = np.random.default_rng(0)
    for shard in range(shards):
        with tarfile.open(os.path.join(root, f"train-{shard:04d}.tar"), "w") as tar:
            for i in range(per_shard):
                buffer = io.BytesIO()
                np.save(buffer, rng.standard_normal((3, 64, 64), dtype=np.float32))
                for ext, data in ((".npy", buffer.getvalue()), (".cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"sample{shard:04d}{i:06d}{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def as_pair(sample: dict) -> tuple[np.ndarray, int]:
    return sample["npy"], sample["cls"]


def pipeloom_pipe(root: str):
    return (
        FileLister(root, "*.tar")
        .open_files("rb")
        .load_from_tar()
        .webdataset()
        .decode()
        .map(as_pair)
        .batch(BATCH)
        .collate()
    )


class TarIndexDataset(torch.utils.data.Dataset):
    """Random access into tar shards through an index built once with tarfile."""

    def __init__(self, root: str) -> None:
        self.index: list[tuple[str, int, int, int, int]] = []
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            members: dict[str, dict[str, tuple[int, int]]] = {}
            with tarfile.open(path) as tar:
                for member in tar:
                    key, ext = member.name.split(".", 1)
                    members.setdefault(key, {})[ext] = (member.offset_data, member.size)
            for key in members:
                npy, cls = members[key]["npy"], members[key]["cls"]
                self.index.append((path, *npy, *cls))
        self._files: dict[str, io.BufferedReader] = {}

    def __len__(self) -> int:
        return len(self.index)

    def _read(self, path: str, offset: int, size: int) -> bytes:
        handle = self._files.get(path)
        if handle is None:
            handle = self._files[path] = open(path, "rb")  # noqa: SIM115
        handle.seek(offset)
        return handle.read(size)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        path, npy_offset, npy_size, cls_offset, cls_size = self.index[i]
        array = np.load(io.BytesIO(self._read(path, npy_offset, npy_size)), allow_pickle=False)
        return array, int(self._read(path, cls_offset, cls_size))

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    args = parser.parse_args()
    shards, per_shard, repeats = (4, 100, 1) if args.quick else (8, 500, 3)
    total = shards * per_shard
    with tempfile.TemporaryDirectory() as root:
        write_shards(root, shards, per_shard)
        pipe = pipeloom_pipe(root)
        dataset = TarIndexDataset(root)
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=0)
        ours, theirs = list(pipe), list(loader)
        assert len(ours) == len(theirs) and all(
            torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(ours, theirs)
        ), "pipeloom and torch produced different batches"
        del ours, theirs
        t_pipe = best_time(lambda: consume(pipe), repeats)
        t_torch = best_time(lambda: consume(loader), repeats)
        dataset.close()
    rows = [
        ["pipeloom (in-process)", f"{total / t_pipe:,.0f}", f"{t_pipe * 1e3:.0f}"],
        ["torch DataLoader (num_workers=0)", f"{total / t_torch:,.0f}", f"{t_torch * 1e3:.0f}"],
    ]
    print_table(
        f"tar shards: {shards} x {per_shard} samples (3x64x64 float32 + cls), batch {BATCH}",
        ["reader", "samples/s", "epoch ms"],
        rows,
    )
    note(f"ratio pipeloom/torch throughput: {t_torch / t_pipe:.2f}x")


if __name__ == "__main__":
    main()
