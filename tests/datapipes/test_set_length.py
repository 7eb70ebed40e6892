"""LengthSetter (set_length): a declared len(), items unchanged."""

from __future__ import annotations

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, LengthSetter
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere


def test_declares_the_length_without_changing_the_items():
    dp = IterableWrapper(range(10)).filter(lambda x: x < 5).set_length(3)
    assert isinstance(dp, LengthSetter) and repr(dp) == "LengthSetter(length=3)"
    assert list(dp) == [0, 1, 2, 3, 4] and len(dp) == 3


def test_the_loader_reports_the_declared_length():
    pipe = IterableWrapper(iter_range(7)).set_length(7).sharding_filter().batch(2)
    with DataLoader(pipe) as loader:
        assert len(loader) == 4


def iter_range(n):
    class Unsized:
        def __iter__(self):
            return iter(range(n))

    return Unsized()


@pytest.mark.parametrize("bad", [-1, 2.0, True, None])
def test_bad_length_is_rejected(bad):
    with pytest.raises(ValueError, match=f"length must be an int >= 0, got {bad!r}"):
        IterableWrapper([]).set_length(bad)


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(range(6)).set_length(6).batch(4))


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: IterableWrapper(range(9)).shuffle().sharding_filter().set_length(9).batch(2)
    )
    assert sorted(x for batch in epochs[0] for x in batch) == list(range(9))
