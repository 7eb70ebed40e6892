"""The graph API: traverse, find, replace, remove, to_dot, placement."""

from __future__ import annotations

import pytest

from pipeloom.datapipes import DataPipe, IterableWrapper, IterDataPipe
from pipeloom.graph import Placement, copy, find, remove, replace, to_dot, traverse, upstream


class Step(IterDataPipe):
    inputs = ("source",)

    def __init__(self, source, name="step"):
        self.source, self.name = source, name

    def __iter__(self):
        for x in self.source:
            yield (self.name, x)

    def __repr__(self):
        return f"Step({self.name!r})"


class Join(IterDataPipe):
    inputs = ("datapipes",)

    def __init__(self, *datapipes):
        self.datapipes = datapipes

    def __iter__(self):
        for pipe in self.datapipes:
            yield from pipe


def diamond():
    source = IterableWrapper([1])
    left, right = Step(source, "left"), Step(source, "right")
    return source, left, right, Join(left, right)


def test_traverse_lists_each_node_once_with_one_edge_per_input():
    source, left, right, out = diamond()
    graph = traverse(out)
    assert graph.output is out and len(graph.nodes) == 4
    assert sorted(graph.edges) == sorted(
        [
            (graph.index(left), 0),
            (graph.index(right), 0),
            (graph.index(source), graph.index(left)),
            (graph.index(source), graph.index(right)),
        ]
    )
    assert graph.consumers(source) == [left, right] or graph.consumers(source) == [right, left]
    assert graph.sources() == [source]
    assert set(map(id, graph.upstream(left))) == {id(left), id(source)}


def test_find_by_type_and_predicate():
    source, left, right, out = diamond()
    assert set(map(id, find(out, Step))) == {id(left), id(right)}
    assert find(out, lambda b: getattr(b, "name", None) == "right") == [right]
    assert find(out, DataPipe)[0] is out
    with pytest.raises(TypeError, match="block class or a predicate"):
        find(out, 3)  # type: ignore[arg-type]


def test_replace_rewires_every_consumer():
    source, left, right, out = diamond()
    new_source = IterableWrapper([7])
    assert replace(out, source, new_source) is out
    assert list(out) == [("left", 7), ("right", 7)]


def test_replace_the_output_returns_the_new_output():
    source, left, right, out = diamond()
    new_out = Step(out, "top")
    assert replace(out, out, new_out) is new_out


def test_replace_that_would_create_a_cycle_is_refused_and_undone():
    source = IterableWrapper([1])
    a = Step(source, "a")
    b = Step(a, "b")
    with pytest.raises(ValueError, match="cycle"):
        replace(b, source, Step(b, "loop"))
    assert a.source is source


def test_replace_a_block_not_in_the_pipeline_is_an_error():
    with pytest.raises(ValueError, match="not part of this pipeline"):
        replace(Step(IterableWrapper([1])), IterableWrapper([2]), IterableWrapper([3]))


def test_remove_splices_out_a_single_input_block():
    source = IterableWrapper([1, 2])
    middle = Step(source, "mid")
    top = Step(middle, "top")
    assert remove(top, middle) is top
    assert list(top) == [("top", 1), ("top", 2)]
    assert remove(top, top) is source


def test_remove_refuses_multi_input_blocks():
    *_, out = diamond()
    with pytest.raises(ValueError, match="exactly one input.*has 2"):
        remove(out, out)


def test_to_dot_draws_nodes_edges_and_placement_clusters():
    source, left, right, out = diamond()
    text = to_dot(out)
    assert text.startswith("digraph pipeline {") and text.count("->") == 4
    assert "Step('left')" in text
    placement = Placement(
        out,
        tuple((block, "worker" if block is not out else "main") for block in traverse(out).nodes),
    )
    clustered = placement.to_dot()
    assert clustered.count("subgraph cluster_") == 2 and 'label="worker"' in clustered
    assert placement.where(out) == "main"
    assert "main: Join()" in str(placement)


def test_to_dot_escapes_quotes_in_labels():
    assert '\\"' in to_dot(Step(IterableWrapper([1]), 'say "hi"'))


def test_copy_is_deep_and_keeps_shared_blocks_shared():
    source, left, right, out = diamond()
    twin = copy(out)
    nodes = traverse(twin).nodes
    assert len(nodes) == 4 and not {id(n) for n in nodes} & {id(source), id(left), id(right)}
    twin_left, twin_right = twin.datapipes
    assert twin_left.source is twin_right.source  # one copy of the shared source
    assert list(twin) == list(out)


def test_copy_puts_the_replacement_in_place_without_copying_it():
    source, left, right, out = diamond()
    other = IterableWrapper([7])
    twin = copy(out, replace={source: other})
    assert all(step.source is other for step in twin.datapipes)
    assert list(twin) == [("left", 7), ("right", 7)] and list(out) == [("left", 1), ("right", 1)]
    assert copy(out, replace={out: other}) is other


def test_copy_refuses_a_replacement_for_a_block_not_in_the_pipeline():
    _, _, _, out = diamond()
    with pytest.raises(ValueError, match=r"IterableWrapper\(\[2\]\) is not part of the pipeline"):
        copy(out, replace={IterableWrapper([2]): IterableWrapper([3])})


def test_upstream_is_traverse_nodes():
    source, left, right, out = diamond()
    assert upstream(out) == list(traverse(out).nodes)
    assert upstream(left) == [left, source]
