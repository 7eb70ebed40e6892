"""Streams an opener hands out to code that reads them and does not close them.

``FileLister(...).open_files().map(lambda x: x[1].read())`` is how most
pipelines read files (torchdata's tutorials do it): the map reads each stream
and lets it go. A resume re-opened every such stream still open at the
checkpoint, so the epoch gave every file read before it a second time, and an
epoch kept every file it had read open until its end.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import FileLister
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.testing import check_resume_from_every_step

FILES = 12


def read(pair):
    return pair[1].read()  # reads, never closes


def member(pair):
    data = pair[1] if isinstance(pair[1], bytes) else pair[1].read()
    return pair[0].rsplit("/", 1)[-1], data


@pytest.fixture
def files(tmp_path):
    for index in range(FILES):
        (tmp_path / f"f{index:02d}.txt").write_bytes(str(index).encode())
    return str(tmp_path)


def read_files(root):
    return FileLister(root, "*.txt").sharding_filter().open_files("rb").map(read)


def test_a_resume_does_not_read_again_the_files_a_map_read_and_left_open(files):
    check_resume_from_every_step(lambda: read_files(files))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "service",
    [None, lambda: ThreadReadingService(2), lambda: MultiProcessingReadingService(2, timeout=30)],
    ids=["in-process", "threads", "processes"],
)
def test_a_loader_resumed_mid_epoch_gives_each_file_once(files, service):
    make = service or (lambda: None)
    expected = [str(index).encode() for index in range(FILES)]
    for stop in (1, 7):
        with DataLoader(read_files(files), make()) as loader:
            iterator = iter(loader)
            head = [next(iterator) for _ in range(stop)]
            state = loader.state_dict()
        with DataLoader(read_files(files), make()) as resumed:
            resumed.load_state_dict(state)
            assert head + list(resumed) == expected, stop


def test_a_reader_in_the_middle_of_a_compressed_shard_still_resumes_there(tmp_path):
    # load_from_tar claims the stream it reads: that shard is re-opened on resume and the
    # members already given are skipped
    for shard in range(2):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for index in range(4):
                data = f"{shard}-{index}".encode()
                info = tarfile.TarInfo(f"m{index}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        (tmp_path / f"s{shard}.tar.gz").write_bytes(gzip.compress(buffer.getvalue()))

    def make():
        return FileLister(str(tmp_path), "*.tar.gz").open_files("rb").load_from_tar().map(member)

    check_resume_from_every_step(make)


def test_a_claim_reaches_the_opened_stream_under_a_decompressor(tmp_path):
    for part in range(2):
        lines = "".join(f"{part}-{index}\n" for index in range(4)).encode()
        (tmp_path / f"p{part}.txt.gz").write_bytes(gzip.compress(lines))

    def make():
        return FileLister(str(tmp_path), "*.gz").open_files("rb").decompress().readlines()

    check_resume_from_every_step(make)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_an_epoch_keeps_open_only_the_streams_in_use(files):
    before = _open_fds()
    most = 0
    for _ in read_files(files):
        most = max(most, _open_fds() - before)
    assert most <= 2  # was one per file read so far: 12 at the end of the epoch


def test_streams_held_downstream_stay_open_until_read(files):
    # a batch of streams: each is held by the batch, so none is closed under it
    batches = FileLister(files, "*.txt").open_files("rb").batch(5)
    reads = [[stream.read() for _, stream in batch] for batch in batches]
    assert sum(reads, []) == [str(index).encode() for index in range(FILES)]
