"""Tests for PinMemory and ToDevice (``pin_memory`` / ``to_device``).

Everything runs on CPU; the tests marked ``needs_cuda`` run where a GPU exists.
"""

from __future__ import annotations

import collections
import gc
import pickle
import threading
import traceback
from types import MappingProxyType

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import (
    BlockingReader,
    IterableWrapper,
    IterDataPipe,
    Mapper,
    PinMemory,
    ToDevice,
    pipeline_state_dict,
    reset_pipeline,
)
from pipeloom.datapipes._device import apply_to_tensors
from pipeloom.testing import check_resume_from_every_step, collect, collect_async
from tests.datapipes.helpers import Flaky, WithPosition, raise_in_source
from tests.strategies import small_ints

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
without_cuda = pytest.mark.skipif(CUDA, reason="checks the CPU-only fallback")

Pair = collections.namedtuple("Pair", "image label")


_EARLIER: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _earlier_device_threads():
    """Device threads that were running before the test (another test's loader that
    garbage collection has not reached yet) are not this test's."""
    _EARLIER.clear()
    _EARLIER.update(device_threads(all_of_them=True))
    yield
    _EARLIER.clear()


def device_threads(*, all_of_them: bool = False):
    """The device threads this test started that are still running."""
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith(("pipeloom ToDevice", "pipeloom PinMemory"))
        and (all_of_them or t not in _EARLIER)
    ]


def assert_same(got, expected):
    """Same structure, types and values; tensors compared by value."""
    assert type(got) is type(expected), (got, expected)
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and torch.equal(got.cpu(), expected.cpu())
    elif isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            assert_same(got[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert_same(a, b)
    else:
        assert got == expected


def nested_batches(n=6):
    return [
        {
            "image": torch.arange(12, dtype=torch.float32).reshape(3, 4) + i,
            "meta": [Pair(torch.tensor([i]), f"cls{i}"), (i, b"raw", None)],
            "name": f"sample-{i}",
        }
        for i in range(n)
    ]


def spy_tensor_class():
    """A tensor type that records in which thread each ``.to()`` runs, with events."""

    class Spy(torch.Tensor):
        copies: list[str] = []
        copied: dict[int, threading.Event] = {}

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.Tensor.to:
                cls.copies.append(threading.current_thread().name)
                event = cls.copied.get(len(cls.copies))
                if event is not None:
                    event.set()
            return super().__torch_function__(func, types, args, kwargs or {})

    return Spy


class Failing(IterDataPipe):
    def __init__(self, n, fail_at):
        self.n, self.fail_at = n, fail_at

    def __iter__(self):
        for i in range(self.n):
            if i == self.fail_at:
                raise_in_source(i)
            yield torch.tensor([i])


# -- values --------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda s: ToDevice(s, "cpu"), lambda s: PinMemory(s)])
def test_nested_batches_come_out_equal_sync_and_async(make):
    batches = nested_batches()
    dp = make(IterableWrapper(batches))
    for got in (list(dp), collect_async(dp)):
        assert len(got) == len(batches)
        for a, b in zip(got, batches):
            assert_same(a, b)
    assert len(dp) == len(batches)


leaves = st.one_of(
    small_ints,
    st.text(max_size=3),
    st.none(),
    st.lists(small_ints, max_size=4).map(lambda xs: torch.tensor(xs, dtype=torch.int64)),
)
structures = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=2), inner, max_size=3),
        st.tuples(inner, inner).map(lambda t: Pair(*t)),
    ),
    max_leaves=8,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(structures, max_size=5))
def test_any_nested_structure_passes_through_with_equal_values(items):
    for dp in (ToDevice(IterableWrapper(items), "cpu"), PinMemory(IterableWrapper(items))):
        got = list(dp)
        assert len(got) == len(items)
        for a, b in zip(got, items):
            assert_same(a, b)


@without_cuda
def test_pin_memory_without_cuda_returns_the_very_same_objects_and_never_warns():
    batches = nested_batches(3)
    got = list(PinMemory(IterableWrapper(batches)))  # filterwarnings=error: no pin warning
    assert all(a is b for a, b in zip(got, batches))


def test_pin_memory_for_cpu_is_a_pass_through():
    batches = nested_batches(3)
    assert all(a is b for a, b in zip(PinMemory(IterableWrapper(batches), "cpu"), batches))


def test_to_device_cpu_keeps_cpu_tensors_in_place():
    x = torch.ones(3)
    (out,) = list(ToDevice(IterableWrapper([{"x": x}]), torch.device("cpu")))
    assert out["x"] is x and out["x"].device.type == "cpu"


def test_apply_to_tensors_keeps_container_types_like_torch_pin_memory():
    ordered = collections.OrderedDict(a=torch.ones(1))
    default = collections.defaultdict(list, a=torch.ones(1))
    frozen = MappingProxyType({"a": torch.ones(1)})
    double = lambda t: t * 2  # noqa: E731
    assert type(apply_to_tensors(ordered, double)) is collections.OrderedDict
    assert apply_to_tensors(default, double).default_factory is list
    assert apply_to_tensors(frozen, double)["a"].item() == 2
    assert apply_to_tensors(range(3), double) == [0, 1, 2]
    assert apply_to_tensors(bytearray(b"ab"), double) == bytearray(b"ab")
    assert apply_to_tensors(Pair(torch.ones(1), "x"), double).image.item() == 2


# -- running ahead ---------------------------------------------------------------------


def test_copies_run_in_the_thread_ahead_of_the_consumer():
    spy = spy_tensor_class()
    third_copy = spy.copied[3] = threading.Event()
    dp = ToDevice(IterableWrapper([torch.tensor([i]).as_subclass(spy) for i in range(8)]), "cpu")
    reset_pipeline(dp)
    reader = BlockingReader(dp)
    assert reader.next(timeout=10).item() == 0
    # batches 1 and 2 are copied while the consumer still works on batch 0
    assert third_copy.wait(timeout=10)
    assert [reader.next(timeout=10).item() for _ in range(7)] == list(range(1, 8))
    assert set(spy.copies) == {"pipeloom ToDevice(device='cpu', non_blocking=True, buffer_size=2)"}
    reader.close()


def test_buffer_holds_at_most_buffer_size_prepared_items():
    spy = spy_tensor_class()
    third_copy = spy.copied[3] = threading.Event()
    dp = ToDevice(IterableWrapper([torch.tensor([i]).as_subclass(spy) for i in range(8)]), "cpu")
    reset_pipeline(dp)
    reader = BlockingReader(dp)
    reader.next(timeout=10)
    assert third_copy.wait(timeout=10)
    state = dp.state_dict()  # pauses the thread
    assert [t.item() for t, _ in state["items"]] == [1, 2]
    assert spy.copies.count(spy.copies[0]) == 3 and spy.copies[0] != "MainThread"
    reader.close()
    reset_pipeline(dp)


def test_waits_on_an_upstream_that_is_not_ready_through_its_events():
    assert collect_async(ToDevice(Flaky(range(30), seed=2), "cpu")) == list(range(30))
    assert collect(PinMemory(Flaky(range(30), seed=3), buffer_size=1)) == list(range(30))


def test_items_keep_their_stamps():
    pairs = collect(WithPosition(ToDevice(IterableWrapper("abcde"), "cpu")))
    assert pairs == [(c, i) for i, c in enumerate("abcde")]


# -- lifecycle ---------------------------------------------------------------------------


def test_source_exception_is_raised_in_the_consumer_with_its_traceback():
    it = iter(ToDevice(Failing(10, fail_at=3), "cpu"))
    assert [next(it).item() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="bad item 3") as info:
        next(it)
    text = "".join(traceback.format_exception(info.value))
    assert "raise_in_source" in text and "ToDevice(device='cpu'" in text
    with pytest.raises(StopIteration):
        next(it)


def test_reset_mid_stream_stops_and_joins_the_thread():
    dp = PinMemory(IterableWrapper(range(1000)))
    it = iter(dp)
    next(it)
    assert len(device_threads()) == 1
    reset_pipeline(dp)
    assert device_threads() == []
    assert list(dp)[:3] == [0, 1, 2]


def test_garbage_collection_stops_the_thread():
    dp = ToDevice(IterableWrapper(range(1000)), "cpu")
    it = iter(dp)
    next(it)
    assert len(device_threads()) == 1
    del dp, it
    gc.collect()
    assert device_threads() == []


def test_no_thread_leak_over_many_epochs():
    dp = ToDevice(IterableWrapper([torch.tensor([i]) for i in range(10)]), "cpu")
    for epoch in range(30):
        it = iter(dp)
        assert [next(it).item() for _ in range(epoch % 5)] == list(range(epoch % 5))
    reset_pipeline(dp)
    assert device_threads() == []


def test_a_pickled_copy_is_fresh():
    dp = ToDevice(IterableWrapper(range(5)), "cpu")
    it = iter(dp)
    next(it)
    copy = pickle.loads(pickle.dumps(dp))
    assert copy._worker is None
    assert list(copy) == list(range(5))
    reset_pipeline(dp)


# -- state -------------------------------------------------------------------------------


def as_lists(batch):
    return {key: value.tolist() for key, value in batch.items()}


def test_resume_from_every_step():
    def tensors(n):
        return IterableWrapper([{"x": torch.full((2,), i)} for i in range(n)])

    check_resume_from_every_step(lambda: Mapper(ToDevice(tensors(9), "cpu"), as_lists))
    check_resume_from_every_step(lambda: Mapper(PinMemory(tensors(7), buffer_size=3), as_lists))
    check_resume_from_every_step(lambda: ToDevice(Flaky(range(8)), "cpu").shuffle(buffer_size=3))
    assert device_threads() == []


# -- placement and arguments -----------------------------------------------------------------


def test_blocks_stay_in_the_main_process_and_are_not_shardable():
    for dp in (ToDevice(IterableWrapper([]), "cpu"), PinMemory(IterableWrapper([]))):
        assert dp.per_item is False and dp.is_shardable() is False
        assert dp.inputs == ("source",)


def test_repr_shows_the_arguments():
    src = IterableWrapper([])
    assert repr(ToDevice(src, "cpu")) == "ToDevice(device='cpu', non_blocking=True, buffer_size=2)"
    assert repr(ToDevice(src, torch.device("cpu"), False, 4)) == (
        "ToDevice(device='cpu', non_blocking=False, buffer_size=4)"
    )
    assert repr(PinMemory(src)) == "PinMemory(device=None, buffer_size=2)"


@pytest.mark.parametrize(
    ("device", "error", "match"),
    [
        (1.5, TypeError, r"device must be a str, torch.device or int .*got float 1.5; write e.g."),
        (True, TypeError, r"device must be a str, torch.device or int"),
        ("gpu", ValueError, r"to_device\(device='gpu'\): torch does not know this device"),
        (-1, ValueError, r"device index must be >= 0, got -1"),
        ("mps", ValueError, r"only 'cpu' and 'cuda' devices are supported, got 'mps'"),
    ],
)
def test_bad_devices_are_refused_at_construction(device, error, match):
    with pytest.raises(error, match=match):
        ToDevice(IterableWrapper([]), device)


@without_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda"), 0])
def test_cuda_without_a_gpu_is_refused_with_a_fix(device):
    match = r"needs CUDA, but torch.cuda.is_available\(\) is False on this machine; use 'cpu'"
    with pytest.raises(ValueError, match=r"to_device\(device=.*" + match):
        ToDevice(IterableWrapper([]), device)
    with pytest.raises(ValueError, match=r"pin_memory\(device=.*" + match):
        PinMemory(IterableWrapper([]), device)


def test_other_arguments_are_validated():
    with pytest.raises(TypeError, match=r"non_blocking must be a bool, got str 'yes'"):
        ToDevice(IterableWrapper([]), "cpu", non_blocking="yes")
    with pytest.raises(ValueError, match=r"buffer_size must be an int >= 1, got 0"):
        ToDevice(IterableWrapper([]), "cpu", buffer_size=0)
    with pytest.raises(ValueError, match=r"buffer_size must be an int >= 1, got 0"):
        PinMemory(IterableWrapper([]), buffer_size=0)


def test_functional_methods_build_the_blocks():
    dp = IterableWrapper([torch.ones(1)]).pin_memory().to_device("cpu", non_blocking=False)
    assert isinstance(dp, ToDevice) and isinstance(dp.source, PinMemory)
    assert [t.item() for t in dp] == [1.0]


# -- CUDA ------------------------------------------------------------------------------------


@needs_cuda
def test_to_device_cuda_lands_on_the_gpu_with_equal_values():
    batches = nested_batches()
    for device in ("cuda", 0, torch.device("cuda:0")):
        got = list(ToDevice(IterableWrapper(batches), device))
        for a, b in zip(got, batches):
            assert a["image"].device.type == "cuda" and a["meta"][0].image.is_cuda
            assert a["name"] == b["name"] and a["meta"][1] == b["meta"][1]
            assert_same(a, b)


@needs_cuda
@pytest.mark.parametrize("non_blocking", [True, False])
@pytest.mark.parametrize("consumer_stream", [False, True])
def test_values_are_right_when_the_consumer_uses_them_at_once(non_blocking, consumer_stream):
    n, size = 24, 1 << 20  # 4 MiB per batch, so copies take a while
    batches = [torch.full((size,), float(i)) for i in range(n)]
    dp = ToDevice(IterableWrapper(batches), "cuda", non_blocking=non_blocking)
    weights = torch.randn(1024, 1024, device="cuda")
    stream = torch.cuda.Stream() if consumer_stream else torch.cuda.current_stream()
    stream.wait_stream(torch.cuda.current_stream())  # weights were made on the default stream
    sums = []
    with torch.cuda.stream(stream):
        for batch in dp:
            for _ in range(4):  # the "model": keeps the consumer's stream busy
                weights = torch.tanh(weights @ weights)
            sums.append((batch * 2).sum())
            del batch  # freed early: record_stream keeps the memory from reuse
    torch.cuda.synchronize()
    assert [s.item() for s in sums] == [2.0 * i * size for i in range(n)]
    assert dp._copier._stream is not None
    assert dp._copier._stream != torch.cuda.current_stream()


@needs_cuda
def test_pin_memory_on_cuda_pins_tensors_and_keeps_other_leaves():
    batches = nested_batches(3)
    got = list(PinMemory(IterableWrapper(batches)))
    for a, b in zip(got, batches):
        assert a["image"].is_pinned() and a["meta"][0].image.is_pinned()
        assert_same(a, b)
    cuda = list(ToDevice(PinMemory(IterableWrapper(batches)), "cuda"))
    assert all(a["image"].is_cuda for a in cuda)


@needs_cuda
def test_state_on_cuda_holds_cpu_copies_and_resumes():
    dp = ToDevice(IterableWrapper([{"x": torch.full((2,), i)} for i in range(6)]), "cuda")
    reset_pipeline(dp)
    reader = BlockingReader(dp)
    reader.next(timeout=10)
    state = pipeline_state_dict(dp)
    items = state["blocks"][0]["state"]["items"]
    assert items and all(item["x"].device.type == "cpu" for item, _ in items)
    reader.close()
    reset_pipeline(dp)

    def make():
        return Mapper(
            ToDevice(IterableWrapper([{"x": torch.full((2,), i)} for i in range(7)]), "cuda"),
            lambda b: b["x"].cpu().tolist(),
        )

    check_resume_from_every_step(make)


@needs_cuda
def test_cuda_index_out_of_range_is_refused():
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"asks for CUDA device {count}, but this machine has"):
        ToDevice(IterableWrapper([]), f"cuda:{count}")


def _mark_pinned(item, device):
    return ("pinned", device.type, item.pin_memory())


@needs_cuda
def test_pin_memory_fn_pins_each_item_with_the_device():
    out = list(IterableWrapper([torch.ones(2)]).pin_memory(pin_memory_fn=_mark_pinned))
    assert out[0][:2] == ("pinned", "cuda") and out[0][2].is_pinned()


@without_cuda
def test_pin_memory_fn_is_not_called_without_cuda():
    out = list(IterableWrapper([torch.ones(2)]).pin_memory(pin_memory_fn=_mark_pinned))
    assert torch.equal(out[0], torch.ones(2))
    with pytest.raises(TypeError, match="pin_memory_fn must be a callable"):
        IterableWrapper([]).pin_memory(pin_memory_fn="yes")
