"""ZipperLongest (zip_longest): zip until the longest stream ends."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import IterableWrapper, SequenceWrapper, ZipperLongest
from pipeloom.testing import check_resume_from_every_step, collect_async
from tests.datapipes.everywhere import check_same_output_everywhere
from tests.datapipes.helpers import Flaky


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(), max_size=6), min_size=1, max_size=4))
def test_matches_itertools_zip_longest(lists):
    dp = ZipperLongest(*(IterableWrapper(x) for x in lists), fill_value=-1)
    assert list(dp) == list(itertools.zip_longest(*lists, fillvalue=-1))
    assert len(dp) == max(len(x) for x in lists)


def test_functional_form_and_not_available():
    dp = IterableWrapper("ab").zip_longest(IterableWrapper(range(3)))
    assert (
        list(dp) == [("a", 0), ("b", 1), (None, 2)] and repr(dp) == "ZipperLongest(fill_value=None)"
    )
    flaky = ZipperLongest(Flaky(range(5), seed=1), Flaky("abc", seed=2))
    assert collect_async(flaky) == list(itertools.zip_longest(range(5), "abc"))


def test_non_iter_inputs_are_rejected():
    with pytest.raises(TypeError, match=r"zip_longest\(\) argument 2 must be an IterDataPipe"):
        IterableWrapper([]).zip_longest(SequenceWrapper([]))


def test_resume_from_every_step():
    check_resume_from_every_step(
        lambda: IterableWrapper(range(3)).zip_longest(Flaky(range(10, 16)), fill_value="x")
    )


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: IterableWrapper(range(4)).zip_longest(IterableWrapper("abcdefg")).sharding_filter()
    )
    assert epochs[0] == list(itertools.zip_longest(range(4), "abcdefg"))
