"""IndexAdder (add_index): number dict items."""

from __future__ import annotations

from collections import defaultdict

import pytest

from pipeloom.datapipes import IndexAdder, IterableWrapper
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


def test_numbers_copies_of_the_items():
    rows = [{"a": 1, "b": 2}, {"c": 3, "a": 1}]
    dp = IterableWrapper(rows).add_index("order")
    assert list(dp) == [{"a": 1, "b": 2, "order": 0}, {"c": 3, "a": 1, "order": 1}]
    assert rows == [{"a": 1, "b": 2}, {"c": 3, "a": 1}]  # not changed in place
    assert list(dp)[1]["order"] == 1  # restarts each epoch
    assert isinstance(dp, IndexAdder) and repr(dp) == "IndexAdder(index_name='order')"
    assert len(dp) == 2


def test_column_batches_keep_their_type():
    batches = IterableWrapper([{"a": 1}, {"a": 2}]).batch(1).rows2columnar().add_index()
    out = list(batches)
    assert out == [{"a": [1], "index": 0}, {"a": [2], "index": 1}]
    assert type(out[0]) is defaultdict


def test_non_dict_items_point_to_enumerate():
    with pytest.raises(TypeError, match=r"numbers dict items, got int.*use enumerate\(\)"):
        list(IterableWrapper([1]).add_index())
    with pytest.raises(TypeError, match="index_name must be a dict key"):
        IterableWrapper([]).add_index([])


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper([{"v": i} for i in range(5)]).add_index())


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: (
            IterableWrapper([{"v": i} for i in range(8)]).shuffle().sharding_filter().add_index()
        )
    )
    assert [row["index"] for row in epochs[0]] == list(range(8))
    assert epochs[0] != epochs[1]
