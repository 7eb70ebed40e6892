"""A worker killed by the OS (the out-of-memory killer, a crash in a C extension) is
reported with the item it was making, where the main process knows it.

Classic workers make the positions they own in order and the merge reads
each worker's queue to the end before it sees the death, so the position the
merge waited for from the dead worker is the one it was making (or one after
it, if it dropped that one). The compat loader names the sampler's batch.
A death found while the merge waits for another worker is reported as before
(its queue may still hold outputs), so these tests use one worker.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import re
import signal

import pytest
import torch

from pipeloom import DataLoader
from pipeloom.compat import DataLoader as CompatLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.errors import WorkerError
from pipeloom.reading_service import MultiProcessingReadingService


def dies_at_13(x: int) -> int:
    if x == 13:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def first_error(loader) -> WorkerError:
    with loader, pytest.raises(WorkerError) as caught:
        list(loader)
    return caught.value


@pytest.mark.timeout(60)
def test_the_item_a_classic_worker_was_making_is_named():
    pipe = IterableWrapper(range(30)).sharding_filter().map(dies_at_13)
    error = first_error(DataLoader(pipe, MultiProcessingReadingService(1, timeout=30)))
    assert "was killed by signal 9 (SIGKILL)" in str(error)
    assert "It was making the item at position 13" in str(error)
    assert error.item == 13
    # how to confirm an out-of-memory kill, and what to lower
    assert f"journalctl -k` shows 'Killed process {error.dead_pid}'" in str(error)
    assert "lower the batch size, num_workers or prefetch_factor" in str(error)
    assert f"(pid {error.dead_pid})" in error.worker
    assert error.exit_code == -signal.SIGKILL
    copy = pickle.loads(pickle.dumps(error))  # e.g. from a rank, or a worker of a worker
    assert (copy.dead_pid, copy.exit_code, copy.item) == (error.dead_pid, -signal.SIGKILL, 13)


@pytest.mark.timeout(60)
def test_a_worker_building_batches_names_the_batch_it_was_making():
    pipe = IterableWrapper(range(30)).sharding_filter().map(dies_at_13).batch(4)
    error = first_error(DataLoader(pipe, MultiProcessingReadingService(1, timeout=30)))
    assert "It was making the batch of the items at positions 12-15" in str(error)
    assert error.item == 12


@pytest.mark.timeout(60)
def test_the_compat_loader_names_the_sampler_s_batch():
    class DiesAt13(torch.utils.data.Dataset):
        def __len__(self):
            return 30

        def __getitem__(self, i):
            return dies_at_13(i)

    loader = CompatLoader(DiesAt13(), batch_size=4, num_workers=1, timeout=30)
    with pytest.raises(WorkerError, match=r"\(here: batch 3, indices \[12, 13, 14, 15\]\)") as info:
        list(loader)
    loader.shutdown()
    # torch's wording first: code that matches on it (to retry, to log) still does
    pid = info.value.dead_pid
    assert str(info.value).startswith(f"DataLoader worker (pid(s) {pid}) exited unexpectedly: ")
    assert info.value.exit_code == -signal.SIGKILL


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["economic", "chunked"])
def test_economic_and_chunked_name_the_batches_the_dead_worker_was_given(strategy):
    pipe = IterableWrapper(range(30)).sharding_filter().map(dies_at_13).batch(4)
    service = MultiProcessingReadingService(1, strategy=strategy, timeout=30)
    error = first_error(DataLoader(pipe, service))
    match = re.search(
        r"It had been given items of the (batches|chunks) in flight of the items "
        r"at positions ([-\d, ]+)",
        str(error),
    )
    assert match, str(error)
    ranges = [tuple(map(int, r.split("-"))) for r in match.group(2).split(", ")]
    assert any(first <= 13 <= last for first, last in ranges)  # the culprit is among them
    assert error.item == ranges[0][0]
    assert "killed by signal 9 (SIGKILL)" in str(error)
    assert error.exit_code == -signal.SIGKILL and f"(pid {error.dead_pid})" in error.worker


def bus_error_at_13(x: int) -> int:
    if x == 13:
        faulthandler.disable()  # pytest's, inherited: its dump would only add noise
        os.kill(os.getpid(), signal.SIGBUS)
    return x


def segfaults_at_3(x: int) -> int:
    if x == 3:
        faulthandler.disable()
        os.kill(os.getpid(), signal.SIGSEGV)
    return x


@pytest.mark.timeout(60)
def test_a_bus_error_points_at_a_full_dev_shm():
    pipe = IterableWrapper(range(30)).sharding_filter().map(bus_error_at_13)
    error = first_error(DataLoader(pipe, MultiProcessingReadingService(1, timeout=30)))
    assert "was killed by signal 7 (SIGBUS)" in str(error)
    assert "shared memory (/dev/shm) was full" in str(error)
    assert "--shm-size" in str(error)


@pytest.mark.timeout(60)
def test_a_segfault_points_at_a_c_extension_and_faulthandler():
    pipe = IterableWrapper(range(30)).sharding_filter().map(segfaults_at_3).batch(4)
    service = MultiProcessingReadingService(1, strategy="economic", timeout=30)
    error = first_error(DataLoader(pipe, service))
    assert "was killed by signal 11 (SIGSEGV)" in str(error)
    assert "most often in a C extension" in str(error)
    assert "python -X faulthandler" in str(error)
