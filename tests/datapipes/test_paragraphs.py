"""ParagraphAggregator (lines_to_paragraphs): runs of non-empty lines per file."""

from __future__ import annotations

import io
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import IterableWrapper, ParagraphAggregator, item_rng
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.everywhere import check_same_output_everywhere
from tests.datapipes.helpers import Flaky


def reference(items, joiner="\n".join):
    """A paragraph is a run of non-empty lines with one path (torchdata 0.9's rule)."""
    runs = itertools.groupby(items, key=lambda item: (item[0], bool(item[1])))
    return [(path, joiner([line for _, line in run])) for (path, full), run in runs if full]


lines_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["", "x", "y", "z"])), max_size=30
)


@settings(max_examples=200, deadline=None)
@given(items=lines_strategy)
def test_matches_the_reference_rule(items):
    assert list(IterableWrapper(items).lines_to_paragraphs()) == reference(items)


def test_joiner_and_example():
    source = IterableWrapper(
        [("file1", "Line1"), ("file1", "Line2"), ("file2", "Line2,1"), ("file2", "Line2,2")]
    )
    assert list(source.lines_to_paragraphs(joiner=lambda ls: " ".join(ls))) == [
        ("file1", "Line1 Line2"),
        ("file2", "Line2,1 Line2,2"),
    ]
    assert repr(ParagraphAggregator(source)) == "ParagraphAggregator(joiner=join_lines)"


def test_reads_files_through_readlines():
    files = IterableWrapper([("f", io.StringIO("a\nb\n\n\nc\n")), ("g", io.StringIO("d"))])
    assert list(files.readlines().lines_to_paragraphs()) == [("f", "a\nb"), ("f", "c"), ("g", "d")]


def test_survives_not_available():
    items = [("a", "x"), ("a", ""), ("a", "y"), ("b", "z"), ("b", "w")]
    assert collect_async(ParagraphAggregator(Flaky(items, seed=3))) == reference(items)


def test_bad_input_and_joiner_are_rejected():
    with pytest.raises(TypeError, match=r"expects \(path, line\) items, got str 'x'"):
        list(IterableWrapper(["x"]).lines_to_paragraphs())
    with pytest.raises(TypeError, match="expects joiner to be a callable, got str"):
        IterableWrapper([]).lines_to_paragraphs(joiner="\n")


def test_a_paragraph_carries_the_stamp_of_its_first_line():
    items = [("a", "x"), ("a", "y"), ("a", ""), ("a", "z")]
    pipe = IterableWrapper(items).lines_to_paragraphs().map(lambda p: int(item_rng().integers(99)))
    first = collect(pipe, seed=4)
    single = (
        IterableWrapper(items[:1]).lines_to_paragraphs().map(lambda p: int(item_rng().integers(99)))
    )
    assert collect(single, seed=4)[0] == first[0]  # position 0 either way


def test_resume_from_every_step():
    items = [("a", "1"), ("a", "2"), ("a", ""), ("b", "3"), ("b", ""), ("b", ""), ("c", "4")]
    check_resume_from_every_step(lambda: IterableWrapper(items).lines_to_paragraphs())


def test_same_output_everywhere():
    items = [(f"f{i // 7}", "" if i % 3 == 0 else f"line{i}") for i in range(40)]
    epochs = check_same_output_everywhere(
        lambda: IterableWrapper(items).sharding_filter().map(tuple).lines_to_paragraphs()
    )
    assert epochs[0] == reference(items)
