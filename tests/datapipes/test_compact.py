"""CompactStringList: a sequence of str in two NumPy arrays, cheap to read after fork."""

from __future__ import annotations

import multiprocessing
import pickle
import warnings

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeloom.datapipes import CompactStringList

MIB = 1 << 20


def test_behaves_like_an_immutable_sequence_of_str():
    names = CompactStringList(["a", "", "ünï/çode", "z" * 1000])
    assert len(names) == 4
    assert names[0] == "a" and names[1] == "" and names[2] == "ünï/çode"
    assert names[-1] == "z" * 1000
    assert list(names[1:3]) == ["", "ünï/çode"]
    assert "a" in names and names.index("ünï/çode") == 2
    assert names == ["a", "", "ünï/çode", "z" * 1000]
    with pytest.raises(ValueError):
        names._data[0] = 0  # the buffer is read-only


def test_empty_list_has_no_items():
    names = CompactStringList([])
    assert len(names) == 0 and list(names) == []


def test_out_of_range_index_raises_index_error_with_the_size():
    with pytest.raises(IndexError, match="index 3 is out of range for 2 strings"):
        CompactStringList(["a", "b"])[3]


def test_non_str_elements_are_rejected_with_a_fix():
    with pytest.raises(TypeError, match=r"element 1 is bytes .*os.fsdecode"):
        CompactStringList(["a", b"b"])  # type: ignore[list-item]


def test_non_int_index_is_rejected():
    with pytest.raises(TypeError, match="indices must be int or slice, got str"):
        CompactStringList(["a"])["0"]  # type: ignore[index]


def test_storage_is_two_arrays_not_one_object_per_string():
    names = CompactStringList(f"/data/{i:06d}.tar" for i in range(1000))
    assert names.nbytes == 1000 * len("/data/000000.tar") + 1001 * 8
    assert repr(names).startswith("CompactStringList(['/data/000000.tar', ") and "len=1000" in repr(
        names
    )


@given(st.lists(st.text(), max_size=30))
def test_round_trips_any_strings_through_pickle(strings):
    names = CompactStringList(strings)
    assert list(names) == strings
    assert list(pickle.loads(pickle.dumps(names))) == strings


def _child_uss_growth(container, conn) -> None:
    process = psutil.Process()
    before = process.memory_full_info().uss
    total = sum(len(path) for path in container)  # touch every element
    after = process.memory_full_info().uss
    conn.send((after - before, total))
    conn.close()


def _fork_and_touch(container) -> tuple[int, int]:
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    with warnings.catch_warnings():  # Python >= 3.12 warns about fork with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        child = context.Process(target=_child_uss_growth, args=(container, sender))
        child.start()
    sender.close()
    try:
        if not receiver.poll(60):
            raise AssertionError("the forked child did not report within 60 s")
        growth, total = receiver.recv()
    finally:
        child.join(30)
        receiver.close()
        if child.is_alive():
            child.kill()
            child.join()
    return growth, total


@pytest.mark.skipif(not hasattr(psutil.Process(), "memory_full_info"), reason="needs USS")
def test_forked_worker_reading_a_million_paths_does_not_copy_them():
    paths = [f"/datasets/train/shard-{i // 1000:05d}/sample-{i:09d}.jpg" for i in range(1_000_000)]
    compact = CompactStringList(paths)
    plain_growth, plain_total = _fork_and_touch(paths)
    compact_growth, compact_total = _fork_and_touch(compact)
    assert plain_total == compact_total
    assert compact_growth < 50 * MIB, (
        f"compact listing grew the worker by {compact_growth / MIB:.0f} MiB"
    )
    assert plain_growth > 80 * MIB, f"plain list grew only {plain_growth / MIB:.0f} MiB"
