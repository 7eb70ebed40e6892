"""Tar shards of numbered members for the autotune tests."""

from __future__ import annotations

import io
import pathlib
import tarfile


def write_number_shards(root: pathlib.Path, sizes: list[int]) -> None:
    """Shard ``s{k}.tar`` holds members ``{i:04d}.num`` (data ``str(i)``) for ``i`` from
    ``10 * k`` on, ``sizes[k]`` of them."""
    for shard, size in enumerate(sizes):
        with tarfile.open(root / f"s{shard}.tar", "w") as tar:
            for i in range(shard * 10, shard * 10 + size):
                data = str(i).encode()
                info = tarfile.TarInfo(f"{i:04d}.num")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
