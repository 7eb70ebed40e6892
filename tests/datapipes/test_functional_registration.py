"""Custom blocks get a functional name through one explicit decorator."""

from __future__ import annotations

import inspect

import pytest

from pipeloom.datapipes import (
    IterableWrapper,
    IterDataPipe,
    MapDataPipe,
    SequenceWrapper,
    functional_datapipe,
)


def test_registered_iter_block_is_callable_by_name_with_its_signature():
    @functional_datapipe("add_n_for_test")
    class AddN(IterDataPipe):
        """Add n to every item."""

        inputs = ("source",)

        def __init__(self, source, n: int = 1):
            self.source, self.n = source, n

        def __iter__(self):
            return (x + self.n for x in self.source)

    assert list(IterableWrapper([1, 2]).add_n_for_test(n=10)) == [11, 12]
    method = IterDataPipe.add_n_for_test
    assert method.__doc__ == "Add n to every item."
    assert list(inspect.signature(method).parameters) == ["self", "n"]
    del IterDataPipe.add_n_for_test


def test_registered_map_block_lands_on_map_pipes_only():
    @functional_datapipe("negate_for_test")
    class Negate(MapDataPipe):
        inputs = ("source",)

        def __init__(self, source):
            self.source = source

        def __getitem__(self, i):
            return -self.source[i]

        def __len__(self):
            return len(self.source)

    assert SequenceWrapper([1, 2]).negate_for_test()[1] == -2
    assert not hasattr(IterDataPipe, "negate_for_test")
    del MapDataPipe.negate_for_test


def test_registering_an_existing_name_needs_replace_true():
    with pytest.raises(ValueError, match="already has a method 'map'.*replace=True"):

        @functional_datapipe("map")
        class MyMap(IterDataPipe):
            def __iter__(self):
                yield from ()


def _define_scaled(factor):
    """A notebook cell defining the block ``Scaled``; run it again for another version."""

    @functional_datapipe("scaled_for_test")
    class Scaled(IterDataPipe):
        inputs = ("source",)

        def __init__(self, source):
            self.source = source

        def __iter__(self):
            return (x * factor for x in self.source)

    return Scaled


def test_defining_the_same_class_again_replaces_it_another_class_is_refused():
    try:
        _define_scaled(2)
        second = _define_scaled(3)  # the cell run again: same module and qualified name
        assert list(IterableWrapper([1, 2]).scaled_for_test()) == [3, 6]
        assert type(IterableWrapper([1]).scaled_for_test()) is second
        with pytest.raises(
            ValueError, match=r"already has a method 'scaled_for_test' \(registered"
        ):

            @functional_datapipe("scaled_for_test")
            class Other(IterDataPipe):  # another class: the name stays taken
                def __iter__(self):
                    yield from ()

        assert type(IterableWrapper([1]).scaled_for_test()) is second
        with pytest.raises(ValueError, match=r"already has a method 'map'; pick another"):

            @functional_datapipe("map")
            class Map(IterDataPipe):  # a built-in name stays protected too
                def __iter__(self):
                    yield from ()

    finally:
        del IterDataPipe.scaled_for_test


@pytest.mark.parametrize("name", ["", "has space", "_private", 3])
def test_registration_rejects_bad_names(name):
    with pytest.raises(ValueError, match="public Python identifier"):
        functional_datapipe(name)


def test_registration_rejects_non_blocks():
    with pytest.raises(TypeError, match="decorates IterDataPipe or MapDataPipe"):
        functional_datapipe("thing")(int)


def test_core_functional_methods_are_plain_methods_an_ide_sees():
    for name in ["map", "filter", "batch", "shuffle", "sharding_filter", "prefetch", "zip"]:
        assert name in vars(IterDataPipe.__mro__[1]), name
    assert "map" in vars(MapDataPipe.__mro__[1])
    assert "__getattr__" not in vars(IterDataPipe) and type(IterDataPipe) is type
