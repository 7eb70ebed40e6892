import pytest

from pipeloom.datapipes import MapInMemoryCacheHolder, SequenceWrapper
from tests.datapipes.everywhere import check_same_output_everywhere


def counted(values):
    calls = []
    pipe = SequenceWrapper(values).map(lambda x: calls.append(x) or x * 10)
    return pipe, calls


def test_each_item_is_read_from_the_source_once():
    pipe, calls = counted([1, 2, 3])
    cached = pipe.in_memory_cache()
    assert [cached[i] for i in (0, 1, 0, 2, 1)] == [10, 20, 10, 30, 20]
    assert calls == [1, 2, 3]
    assert len(cached) == 3


def test_a_second_epoch_reads_nothing_from_the_source():
    pipe, calls = counted(range(4))
    cached = pipe.in_memory_cache()
    assert list(cached.to_iter()) == [0, 10, 20, 30]
    assert list(cached.to_iter()) == [0, 10, 20, 30]
    assert calls == [0, 1, 2, 3]


def test_an_index_out_of_range_raises_and_is_not_cached():
    pipe, _ = counted([1])
    cached = MapInMemoryCacheHolder(pipe)
    with pytest.raises(IndexError):
        cached[5]
    assert repr(cached) == "MapInMemoryCacheHolder(cached=0)"


def test_a_copy_sent_to_a_worker_starts_empty():
    import pickle

    pipe = SequenceWrapper([1, 2]).in_memory_cache()
    pipe[0]
    assert repr(pickle.loads(pickle.dumps(pipe))) == "MapInMemoryCacheHolder(cached=0)"


@pytest.mark.timeout(60)
def test_same_output_everywhere():
    # MapToIter is the sharding point: each worker reads (and caches) only its indices
    check_same_output_everywhere(
        lambda: SequenceWrapper(range(12)).map(lambda x: x + 1).in_memory_cache().to_iter()
    )
