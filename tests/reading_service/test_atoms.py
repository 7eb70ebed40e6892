"""Big lists of strings in a pipeline pickled without the memo (workers/atoms.py)."""

from __future__ import annotations

import collections.abc
import io
import pickle
import pickletools

import cloudpickle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper
from pipeloom.reading_service import MultiProcessingReadingService
from pipeloom.reading_service.workers import atoms


class Holder:
    """A plain object: its attributes are looked at."""

    def __init__(self, **attributes):
        self.__dict__.update(attributes)


class Reduced(Holder):
    """An object with its own ``__reduce__``: left to it."""

    def __reduce__(self):
        return Holder, (), dict(self.__dict__)


class Table:
    """A map-style dataset holding a list of strings."""

    def __init__(self, n: int) -> None:
        self.strings = [f"{i:08d}-{'é' * (i % 5)}" for i in range(n)]

    def __getitem__(self, index: int) -> tuple[int, str]:
        return index, self.strings[index]


def _round_trip(obj):
    return pickle.loads(atoms.dumps(obj))


def _memoized(data: bytes) -> int:
    """How many objects ``data`` memoizes."""
    return sum(op.name == "MEMOIZE" for op, _, _ in pickletools.genops(data))


atom_lists = st.one_of(
    st.lists(st.text(max_size=8), min_size=0, max_size=40),
    st.lists(st.binary(max_size=8), min_size=0, max_size=40),
)


@settings(max_examples=50, deadline=None)
@given(items=atom_lists, as_tuple=st.booleans(), other=st.integers())
def test_lists_of_strings_come_back_equal_with_their_type_and_sharing(items, as_tuple, other):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(atoms, "MIN_ITEMS", 3)
        patch.setattr(atoms, "_FRAME", -(1 << 30))  # fast, however short the list
        _check_round_trip(items, as_tuple, other)


def _check_round_trip(items: list, as_tuple: bool, other: int) -> None:
    value = tuple(items) if as_tuple else items
    shared = Holder(n=other)
    obj = Holder(a=value, b=value, shared=shared, again=shared, mixed=[*items, 1])
    back = _round_trip(obj)
    assert type(back.a) is type(value) and back.a == value
    assert back.b is back.a  # referenced twice: one object, as with pickle
    assert back.shared is back.again and back.shared.n == other  # the memo is on again
    assert back.mixed == [*items, 1]


def test_a_big_list_of_strings_is_pickled_without_memo(monkeypatch):
    monkeypatch.setattr(atoms, "_FRAME", -(1 << 30))  # fast, however short the list
    monkeypatch.setattr(atoms, "MIN_ITEMS", 10)
    strings = [f"s{i}" for i in range(100)]
    data = atoms.dumps(Holder(strings=strings))
    usual = cloudpickle.dumps(Holder(strings=strings))
    assert _memoized(usual) >= 100  # cloudpickle memoizes each string
    assert _memoized(data) < 100 - 10  # here, none of them
    assert pickle.loads(data).strings == strings


def test_a_list_given_to_the_pipeline_itself_is_pickled_without_memo(monkeypatch):
    monkeypatch.setattr(atoms, "_FRAME", -(1 << 30))  # fast, however short the list
    monkeypatch.setattr(atoms, "MIN_ITEMS", 10)
    strings = [f"s{i}" for i in range(100)]
    pipe = IterableWrapper(strings).sharding_filter()
    data = atoms.dumps(pipe)
    assert _memoized(data) < 100 - 10
    assert list(pickle.loads(data)) == strings


def test_short_or_mixed_lists_and_custom_reduce_are_pickled_as_usual(monkeypatch):
    monkeypatch.setattr(atoms, "MIN_ITEMS", 10)
    strings = [f"s{i}" for i in range(100)]
    for obj in (
        Holder(strings=strings[:5]),
        Holder(strings=[*strings, b"bytes"]),
        Holder(strings={"in": strings}),
        Reduced(strings=strings),
        Holder(kind=Holder, abc=collections.abc.Sequence, strings=strings[:5]),
    ):
        assert _memoized(atoms.dumps(obj)) >= 5, obj
        assert vars(_round_trip(obj)) == vars(obj)


def test_getstate_is_respected(monkeypatch):
    monkeypatch.setattr(atoms, "MIN_ITEMS", 10)

    class Stated(Holder):
        def __getstate__(self):
            return {"strings": self.strings[:50]}

    back = _round_trip(Stated(strings=[f"s{i}" for i in range(100)], secret=1))
    assert back.strings == [f"s{i}" for i in range(50)] and not hasattr(back, "secret")


def test_a_file_written_by_the_pickler_loads_as_a_stream():
    table = Table(atoms.MIN_ITEMS + 5)
    buffer = io.BytesIO()
    atoms.dump(table, buffer)
    buffer.seek(0)
    assert pickle.load(buffer).strings == table.strings


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", ["1", "0"])
def test_a_big_list_of_strings_reaches_spawned_workers_intact(monkeypatch, server):
    monkeypatch.setenv("PIPELOOM_SPAWN_SERVER", server)
    table = Table(3 * atoms.MIN_ITEMS)
    n = len(table.strings)
    pipe = IterableWrapper(range(n)).sharding_filter().map(table.__getitem__)
    service = MultiProcessingReadingService(2, start_method="spawn", timeout=60)
    with DataLoader(pipe, service, seed=0) as loader:
        assert sorted(loader) == [(i, table.strings[i]) for i in range(n)]


def test_a_function_reading_self_classes_beside_torch_pickles():
    # cloudpickle sends, with a function pickled by value, the submodules of its globals
    # named in its code: `self.classes` beside `torch` names torch.classes, a ModuleType
    # subclass pickle cannot pickle. A dataset in __main__ with a `classes` attribute (as
    # ImageFolder has) failed to reach spawn/forkserver workers; torch's loader sends it.
    import torch

    namespace = {"__name__": "not_importable", "torch": torch}
    exec("def count(self):\n    return torch.tensor(len(self.classes))", namespace)
    count = pickle.loads(atoms.dumps(namespace["count"]))
    assert count(Holder(classes=["cat", "dog"])).item() == 2
