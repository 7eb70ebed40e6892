"""Sources: iterables, sequences and torch datasets."""

from __future__ import annotations

import pytest
import torch.utils.data

import pipeloom
from pipeloom import DataLoader
from pipeloom.datapipes import (
    IterableWrapper,
    MapToIter,
    SequenceWrapper,
    as_datapipe,
    current_position,
)
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.testing import check_resume_from_every_step


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        if index >= 4:
            raise IndexError(index)
        return index * index


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter("abc")


def test_torch_map_dataset_becomes_a_sequence_wrapper():
    pipe = as_datapipe(Squares())
    assert isinstance(pipe, SequenceWrapper)
    assert pipe[3] == 9 and len(pipe) == 4 and list(pipe) == [0, 1, 4, 9]


def test_torch_iterable_dataset_becomes_an_iterable_wrapper():
    pipe = as_datapipe(Stream())
    assert isinstance(pipe, IterableWrapper) and list(pipe) == ["a", "b", "c"]


def test_plain_sequences_and_iterables_are_accepted():
    assert list(as_datapipe([3, 4])) == [3, 4]
    assert list(as_datapipe(x for x in range(2))) == [0, 1]


def test_non_iterable_source_gets_a_clear_error():
    with pytest.raises(TypeError, match="cannot use int as a pipeline source"):
        as_datapipe(5)
    with pytest.raises(TypeError, match="IterableWrapper expects an iterable.*got int"):
        IterableWrapper(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="SequenceWrapper expects an object with __getitem__"):
        SequenceWrapper(iter([1]))


def test_iterable_wrapper_restarts_every_epoch():
    pipe = IterableWrapper(range(3))
    assert list(pipe) == list(pipe) == [0, 1, 2]


def test_one_shot_iterator_fails_clearly_on_a_second_epoch():
    pipe = IterableWrapper(x for x in range(2))
    assert list(pipe) == [0, 1]
    with pytest.raises(RuntimeError, match="one-shot iterator.*already consumed"):
        list(pipe)


def test_sources_stamp_item_positions():
    positions = []
    pipe = IterableWrapper("abc")
    for _ in pipe:
        positions.append(current_position())
    assert positions == [0, 1, 2]
    sequence = SequenceWrapper("xyz")
    sequence[2]
    assert current_position() == 2


def test_iterable_wrapper_resumes_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(range(6)))


def test_map_to_iter_reads_in_index_order_and_resumes():
    assert list(MapToIter(SequenceWrapper("hey"))) == ["h", "e", "y"]
    check_resume_from_every_step(lambda: MapToIter(SequenceWrapper(list(range(5)))))
    with pytest.raises(TypeError, match="MapToIter expects a MapDataPipe"):
        MapToIter(IterableWrapper([1]))  # type: ignore[arg-type]


def test_lengths():
    assert len(IterableWrapper([1, 2])) == 2
    with pytest.raises(TypeError, match="has no length"):
        len(IterableWrapper(iter([1])))
    assert len(MapToIter(SequenceWrapper([1, 2, 3]))) == 3


def test_map_to_iter_shards_partition_the_indices_in_runs_of_group_size():
    for total in (1, 2, 3):
        for group in (1, 2, 4):
            seen = []
            for index in range(total):
                pipe = MapToIter(SequenceWrapper(list(range(11))))
                pipe.sharding_settings(total, index)
                pipe.set_shard_group_size(group)
                items = list(pipe)
                assert len(pipe) == len(items)
                assert all((i // group) % total == index for i in items)
                seen += items
            assert sorted(seen) == list(range(11))


def test_map_to_iter_rejects_bad_shard_settings():
    pipe = MapToIter(SequenceWrapper([1]))
    with pytest.raises(ValueError, match="number of shards must be an int >= 1, got 0"):
        pipe.sharding_settings(0, 0)
    with pytest.raises(ValueError, match=r"shard index must be an int in \[0, 2\), got 2"):
        pipe.sharding_settings(2, 2)
    with pytest.raises(ValueError, match="group_size must be an int >= 1"):
        pipe.set_shard_group_size(0)


def test_to_iter_datapipe_is_torchdatas_name_and_takes_indices_or_keys():
    from pipeloom.datapipes import MapToIter

    assert isinstance(SequenceWrapper("abc").to_iter_datapipe(), MapToIter)
    assert list(SequenceWrapper("abc").to_iter_datapipe()) == ["a", "b", "c"]
    assert list(SequenceWrapper("abcd").to_iter_datapipe(indices=[3, 0])) == ["d", "a"]
    table = SequenceWrapper({"x": 1, "y": 2})
    assert list(table.to_iter_datapipe(indices=["y", "x"])) == [2, 1]


def test_iterable_wrapper_reads_a_set_in_sorted_order_and_refuses_an_unsortable_one():
    # a set's own order follows the process's string hash seed (tests/test_cross_interpreter.py)
    words = {f"w{i}" for i in range(30)}
    assert list(IterableWrapper(words)) == sorted(words)
    assert list(IterableWrapper(frozenset(words))) == sorted(words)
    with pytest.raises(TypeError, match=r"cannot be sorted .*sorted\(items, key=str\)"):
        IterableWrapper({1, "a"})


@pytest.mark.parametrize("source", ["/data/train", b"/data/train", bytearray(b"ab")])
def test_a_string_is_refused_as_a_source_saying_what_to_write(source):
    # DataLoader("/data/train") read the path's characters as items, without a word
    with pytest.raises(TypeError, match="its items would be its characters") as caught:
        DataLoader(source)
    assert "FileLister(" in str(caught.value) and "IterableWrapper([" in str(caught.value)
    assert list(IterableWrapper("ab")) == ["a", "b"]  # wrapped explicitly: its characters


class RandomCrops(torch.utils.data.Dataset):
    """A torch dataset that augments in ``__getitem__`` with ``item_rng()``."""

    def __len__(self):
        return 10

    def __getitem__(self, index):
        return index, int(pipeloom.item_rng().integers(1 << 30))


class RandomStream(torch.utils.data.IterableDataset):
    """The same, made by an ``IterableDataset``'s generator."""

    def __iter__(self):
        for index in range(10):
            yield index, int(pipeloom.item_rng().integers(1 << 30))


def _map_style():
    return SequenceWrapper(RandomCrops()).to_iter().batch(3)


def _iterable():
    return IterableWrapper(RandomStream()).sharding_filter().batch(3)


@pytest.mark.parametrize("build", [_map_style, _iterable])
def test_item_rng_in_a_datasets_own_code_is_keyed_by_the_item_it_makes(build):
    """Before, the first item raised 'outside a pipeline', and the others drew with the key
    of the item made before them: neighbours in a batch drew alike, every service differed."""
    with DataLoader(build(), seed=3) as loader:
        expected = list(loader)
    draws = [draw for batch in expected for _, draw in batch]
    assert [index for batch in expected for index, _ in batch] == list(range(10))
    assert len(set(draws)) == 10  # one key per item
    services = {
        "threads": lambda: ThreadReadingService(2),
        "processes": lambda: MultiProcessingReadingService(2),
        "economic": lambda: MultiProcessingReadingService(2, strategy="economic"),
    }
    for name, service in services.items():
        with DataLoader(build(), service(), seed=3) as loader:
            assert list(loader) == expected, name
    check_resume_from_every_step(build, seed=3)
