"""IterToMapConverter (to_map_datapipe): a stream read once into a keyed table."""

from __future__ import annotations

import pytest

from pipeloom.datapipes import IterableWrapper, IterToMapConverter, SequenceWrapper
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


def test_pairs_or_a_key_value_fn():
    table = IterableWrapper([("a", 1), ("b", 2)]).to_map_datapipe()
    assert (table["a"], table["b"], len(table)) == (1, 2, 2)
    words = IterableWrapper(["ant", "bee"]).to_map_datapipe(lambda w: (len(w) + ord(w[0]), w))
    assert (words[100], words[101]) == ("ant", "bee")
    assert (
        isinstance(table, IterToMapConverter)
        and repr(table) == "IterToMapConverter(key_value_fn=None)"
    )


def test_reads_the_stream_lazily_once():
    reads = []
    source = IterableWrapper(range(3)).map(lambda x: reads.append(x) or (x, x * x))
    table = source.to_map_datapipe()
    assert reads == []
    assert table[2] == 4 and table[1] == 1 and reads == [0, 1, 2]


def test_errors_and_duplicates():
    with pytest.raises(KeyError, match="no item has the key 'z'"):
        IterableWrapper([("a", 1)]).to_map_datapipe()["z"]
    with pytest.raises(TypeError, match=r"needs \(key, value\) pairs, got int"):
        len(IterableWrapper([1]).to_map_datapipe())
    with pytest.warns(UserWarning, match="1 keys appear more than once"):
        assert IterableWrapper([("a", 1), ("a", 2)]).to_map_datapipe()["a"] == 2
    with pytest.raises(TypeError, match="expects an IterDataPipe, got SequenceWrapper"):
        IterToMapConverter(SequenceWrapper([]))


def test_joined_with_a_stream_resumes_and_runs_everywhere():
    def make():
        labels = IterableWrapper([(i, f"label{i}") for i in range(6)]).to_map_datapipe()
        return IterableWrapper(range(6)).sharding_filter().zip_with_map(labels, key_fn=int)

    check_resume_from_every_step(make)
    epochs = check_same_output_everywhere(make)
    assert epochs[0] == [(i, f"label{i}") for i in range(6)]
