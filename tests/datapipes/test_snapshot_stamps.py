"""snapshot over items stamped by several blocks (concat, mux) replays each record with the
stamp its own block gives it in the replayed epoch, so ``item_rng()`` downstream draws as
without the snapshot.

Records used to be replayed with one seed: item 0 of the first source and item 0 of the
second then drew the same random numbers in every epoch read back from disk — silently
correlated augmentation.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np
import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, SequenceWrapper, item_rng
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)

pytestmark = pytest.mark.timeout(60)

EPOCHS = 3


def draw(x):
    return (x, int(item_rng().integers(1 << 40)))


def concat(path):
    pipe = IterableWrapper([0, 1]).concat(IterableWrapper(range(500, 503)))
    return pipe.snapshot(path).map(draw)


def mux(path):
    pipe = IterableWrapper(range(4)).mux_longest(IterableWrapper(range(100, 104)))
    return pipe.snapshot(path, allow_random=True).map(draw)


def loader(pipe):
    return DataLoader(pipe, reading_service=InProcessReadingService(), seed=11)


def one_loader(build, path):
    """Epochs 0, 1, 2 of one loader: epoch 0 writes the snapshot, the others read it."""
    with loader(build(path)) as reading:
        return [sorted(reading) for _ in range(EPOCHS)]


def live(build, path):
    """Epoch e of a fresh loader over a fresh directory for each e: every item live."""
    result = []
    for epoch in range(EPOCHS):
        with loader(build(os.path.join(path, f"live{epoch}"))) as fresh:
            fresh.set_epoch(epoch)
            result.append(sorted(fresh))
    return result


@pytest.mark.parametrize("build", [concat, mux], ids=["concat", "mux"])
def test_records_read_back_draw_as_the_live_items(build, tmp_path):
    assert one_loader(build, str(tmp_path / "s")) == live(build, str(tmp_path))


@pytest.mark.parametrize("build", [concat, mux], ids=["concat", "mux"])
def test_no_two_records_share_their_draws(build, tmp_path):
    for epoch in one_loader(build, str(tmp_path)):
        values = [value for _, value in epoch]
        assert len(set(values)) == len(values), epoch


def test_a_later_loader_reads_the_snapshot_with_each_blocks_seed(tmp_path):
    path = str(tmp_path / "s")
    one_loader(concat, path)  # writes it
    assert one_loader(concat, path) == live(concat, str(tmp_path))


def test_a_cycle_upstream_reads_live_with_a_warning_rather_than_repeating_draws(tmp_path):
    def build(path):
        return IterableWrapper(range(3)).cycle(2).snapshot(path, allow_random=True).map(draw)

    with pytest.warns(UserWarning, match="reads its upstream live and keeps nothing"):
        got = one_loader(build, str(tmp_path / "s"))
    with pytest.warns(UserWarning, match="reads its upstream live"):
        expected = live(build, str(tmp_path))
    assert got == expected
    assert all(len({v for _, v in epoch}) == len(epoch) for epoch in got)


def _as_format_4(directory):
    """Rewrite a snapshot as pipeloom wrote it before records named their stamping block."""
    index = np.load(os.path.join(directory, "index.npy"))
    names = [name for name in index.dtype.names if name != "owner"]
    older = np.empty(len(index), dtype=[(n, index.dtype[n]) for n in names])
    for name in names:
        older[name] = index[name]
    with open(os.path.join(directory, "index.npy"), "wb") as file:
        np.save(file, older)
    manifest_path = os.path.join(directory, "manifest.json")
    with open(manifest_path) as file:
        manifest = json.load(file)
    manifest["format"] = 4
    del manifest["owned"]
    for name in manifest["checksums"]:
        with open(os.path.join(directory, name), "rb") as file:
            manifest["checksums"][name] = zlib.crc32(file.read())
    with open(manifest_path, "w") as file:
        json.dump(manifest, file)


def test_a_format_4_snapshot_still_reads_back(tmp_path):
    path = str(tmp_path / "s")
    written = one_loader(concat, path)
    (digest,) = os.listdir(path)
    _as_format_4(os.path.join(path, digest))
    with pytest.warns(UserWarning, match="written by an older pipeloom .* Delete it"):
        with loader(concat(path)) as reading:
            again = sorted(reading)
    assert [x for x, _ in again] == [x for x, _ in written[0]]


@pytest.mark.parametrize(
    "service",
    [
        lambda: ThreadReadingService(3),
        lambda: MultiProcessingReadingService(2, start_method="fork"),
    ],
    ids=["threads", "processes"],
)
def test_a_snapshot_written_in_process_reads_back_under_workers(tmp_path, service):
    # The reader after the workers' merge has another graph, without the records' stamping
    # block (the sharding point, in the workers). It took the merge for the items' stamper,
    # whose seed is drawn from torch's generator: item_rng() after the snapshot drew other
    # numbers than in-process, and others in every run.
    def build():
        pipe = IterableWrapper([7 * i for i in range(20)]).sharding_filter().enumerate()
        return pipe.snapshot(str(tmp_path)).map(draw)

    with loader(build()) as writing:
        written = list(writing)
    with DataLoader(build(), reading_service=service(), seed=11) as reading:
        assert list(reading) == written


def test_records_of_several_stampers_after_a_sharding_point_replay_all_in_order(tmp_path):
    # A sharded map-style source (its own sharding point) concatenated with an iterable: the
    # snapshot was read by asking the sharding point for its positions (0, 1), so the
    # iterable's items at those positions came interleaved and the others were lost. Such
    # records cannot be split by position: the snapshot reads its upstream live, and says so.
    def build():
        first = SequenceWrapper([0, 3]).to_iter()
        return first.concat(IterableWrapper(range(500, 507))).snapshot(str(tmp_path))

    with loader(build()) as reading:
        with pytest.warns(UserWarning, match="reads its upstream live here: the records"):
            epochs = [list(reading) for _ in range(3)]
    assert epochs == [[0, 3, *range(500, 507)]] * 3


def test_a_shuffle_between_the_sharding_point_and_the_snapshot_keeps_its_order(tmp_path):
    # The records, in the shuffle's order, were read back by position: in position order,
    # not the shuffled one the epoch that wrote them had (found by the resume fuzzer with
    # snapshot in place of in_memory_cache, seed 187).
    def build():
        pipe = IterableWrapper(range(12)).sharding_filter().shuffle(buffer_size=4)
        return pipe.snapshot(str(tmp_path), allow_random=True)

    with loader(build()) as writing:
        first = list(writing)
    with pytest.warns(UserWarning, match="reads its upstream live"):
        with loader(build()) as again:
            again.set_epoch(0)
            read = list(again)
    assert first != sorted(first) and read == first
