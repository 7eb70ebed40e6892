"""Attacks on collation: pipeloom's ``default_collate`` against torch's, wherever it runs.

The reference is ``torch.utils.data.default_collate`` in the calling process
(torch's ``DataLoader`` at ``num_workers=0``): the same structure, types,
dtypes, shapes and values, or an error where torch raises one. pipeloom may
collate in the calling thread, into warm buffers (big batches, outside
worker processes) or into a worker's shared memory; batches must not depend
on which.
"""

from __future__ import annotations

import collections
import datetime
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeloom.datapipes._warm as warm
import pipeloom.queues._process as process_queue
from pipeloom import DataLoader as NativeLoader
from pipeloom.compat import DataLoader
from pipeloom.datapipes import IterableWrapper, PadCollate, default_collate
from pipeloom.datapipes._context import collating_into
from pipeloom.datapipes.runtime import set_output_queue
from pipeloom.queues import ProcessQueue
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)
from pipeloom.testing import collect
from tests.reading_service.thread_ranks import ok, rank_service, run_ranks

pytestmark = [
    # torch warns when num_workers is above the CPUs this process may use
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    # and, once per process, when it stacks a read-only array (the first call would fail)
    pytest.mark.filterwarnings("ignore:The given NumPy array is not writable:UserWarning"),
]

Pair = collections.namedtuple("Pair", "left right")


def outcome(collate: Any, batch: list[Any]) -> tuple[str, Any]:
    try:
        return "ok", collate(batch)
    except Exception as error:  # noqa: BLE001 - compared with the other side's
        return "error", type(error)


def difference(a: Any, b: Any, path: str = "batch") -> str | None:
    """Where two collated batches differ (type, dtype, shape or bytes), or None."""
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        if (a.dtype, a.shape) != (b.dtype, b.shape):
            return f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        return None if raw(a) == raw(b) else f"{path}: values {a} vs {b}"
    if isinstance(a, np.ndarray):
        same = (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes())
        return None if same else f"{path}: arrays {a!r} vs {b!r}"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{path}: keys {list(a)} vs {list(b)}"
        pairs: Any = ((f"{path}[{k!r}]", a[k], b[k]) for k in a)
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)}"
        pairs = ((f"{path}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b)))
    else:
        return None if a == b else f"{path}: {a!r} vs {b!r}"
    return next((d for p, x, y in pairs if (d := difference(x, y, p)) is not None), None)


def raw(tensor: torch.Tensor) -> bytes:
    """A tensor's values as bytes (conj/neg bits resolved, any strides)."""
    flat = tensor.resolve_conj().resolve_neg().reshape(-1)
    dense = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return dense.view(torch.uint8).numpy().tobytes()


# -- Python numbers: the NumPy fast path must not read what torch refuses ------------------

odd_neighbours = st.sampled_from(
    [None, "3.5", "nan", b"2", datetime.date(2020, 1, 1), np.bool_(True), np.uint32(2**31)]
    + [np.int8(3), np.float32(0.5), 2**63, 1 + 2j, True, 2, 2.5, torch.tensor(3)]
)


@given(
    first=st.sampled_from([1.5, 7, True]),
    rest=st.lists(st.one_of(st.integers(-9, 9), st.floats(-9, 9), odd_neighbours), max_size=4),
)
def test_numbers_mixed_with_other_types_collate_or_fail_as_torchs(first, rest):
    """[1.0, None] became tensor([1., nan]) and [1.0, "3.5"] tensor([1.0, 3.5]) where
    torch raises TypeError: NumPy's float() read them."""
    batch = [first, *rest]
    expected, got = outcome(tud.default_collate, batch), outcome(default_collate, batch)
    assert got[0] == expected[0], (batch, expected, got)
    if expected[0] == "error":
        assert issubclass(got[1], expected[1]), (batch, expected, got)
    else:
        assert difference(expected[1], got[1]) is None, batch


# -- nested samples, collated in each place pipeloom collates --------------------------------

NUMPY_DTYPES = [np.bool_, np.int8, np.uint16, np.int64, np.uint64, np.float16, np.complex64]
TORCH_DTYPES = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16]
TORCH_DTYPES += [torch.float64, torch.complex64, torch.uint16, torch.uint64]


def leaf(kind: int, dtype: Any, variant: int, i: int) -> Any:
    """Entry ``i`` of a field of one kind: every entry alike but in value."""
    values = (np.arange(6) + i) % 3
    if kind == 0:
        return [i - 1, 0.5 + i, i % 2 == 0, "s" * i, b"b", None][variant]
    if kind == 1:
        return np.dtype(dtype).type(i)
    if kind == 2:
        array = values.astype(dtype).reshape(3, 2)
        views = [array, array[:, ::2], array.T, array.astype(array.dtype.newbyteorder(">"))]
        view = views[variant % 4] if variant < 4 else np.array(i, dtype=dtype)
        view.flags.writeable = variant != 5 and view.flags.writeable
        return view
    tensor = torch.from_numpy(values).to(dtype).reshape(3, 2)
    views = [tensor, tensor[:, ::2], tensor.T, tensor[1:2, 0], tensor.expand(2, 3, 2)]
    if variant == 5:
        return tensor.conj() if dtype.is_complex else torch.tensor(i, dtype=dtype)
    return views[variant]


fields = st.one_of(
    st.tuples(st.just(0), st.none(), st.integers(0, 5)),
    st.tuples(st.just(1), st.sampled_from(NUMPY_DTYPES), st.integers(0, 5)),
    st.tuples(st.just(2), st.sampled_from(NUMPY_DTYPES), st.integers(0, 5)),
    st.tuples(st.just(3), st.sampled_from(TORCH_DTYPES), st.integers(0, 5)),
)
shapes = st.recursive(
    fields,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=2).map(lambda parts: ("dict", parts)),
        st.lists(inner, min_size=1, max_size=2).map(lambda parts: ("list", parts)),
        st.lists(inner, min_size=1, max_size=2).map(lambda parts: ("tuple", parts)),
        st.tuples(inner, inner).map(lambda parts: ("pair", list(parts))),
    ),
    max_leaves=4,
)


def sample(shape: Any, i: int) -> Any:
    kind, *rest = shape
    if isinstance(kind, int):
        return leaf(kind, *rest, i)
    parts = [sample(part, i) for part in rest[0]]
    if kind == "dict":
        return {f"k{j}": part for j, part in enumerate(parts)}
    return {"list": list, "tuple": tuple, "pair": lambda p: Pair(*p)}[kind](parts)


@pytest.fixture
def everywhere(monkeypatch):
    """default_collate as it runs in the calling thread, into warm buffers, and in a
    worker process (into its output queue's shared memory), even for small tensors."""
    monkeypatch.setattr(warm, "WARM_MIN", 0)
    monkeypatch.setattr(process_queue, "ALLOCATE_MIN", 0)

    def in_warm_buffers(batch):
        previous = collating_into(warm.WarmBuffers())
        try:
            return default_collate(batch)
        finally:
            collating_into(previous)

    with ProcessQueue(capacity=4) as queue:

        def in_a_worker(batch):
            set_output_queue(queue)
            try:
                return default_collate(batch)
            finally:
                set_output_queue(None)

        yield {"thread": default_collate, "warm": in_warm_buffers, "worker": in_a_worker}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=shapes, size=st.integers(1, 3))
def test_nested_samples_collate_as_torchs_in_every_place(everywhere, shape, size):
    batch = [sample(shape, i) for i in range(size)]
    expected = outcome(tud.default_collate, batch)
    for where, collate in everywhere.items():
        got = outcome(collate, batch)
        assert got[0] == expected[0], (where, batch, expected, got)
        if expected[0] == "error":
            assert issubclass(got[1], expected[1]), (where, batch, expected, got)
        else:
            assert difference(expected[1], got[1]) is None, (where, batch)


def test_a_key_missing_from_a_later_sample_is_named_with_its_entry():
    """torch's KeyError says only 'label'; which sample lacks it was left to guess."""
    first = {"image": torch.zeros(2), "label": 1}
    batch = [first, {"image": torch.ones(2), "label": 2}, {"image": torch.ones(2)}]
    with pytest.raises(KeyError, match=r"sample\['label'\] is missing from entry 2"):
        default_collate(batch)
    with pytest.raises(KeyError):  # torch raises KeyError too
        tud.default_collate(batch)


# -- what crosses from worker processes ------------------------------------------------------


class Rows(tud.Dataset):
    """Samples whose tensors have one element and a stride other than 1 (m[1:2, 0]),
    and a field whose dtype differs between samples."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> dict[str, Any]:
        m = torch.arange(15).reshape(5, 3) + i
        return {
            "one": m[1:2, 0],  # shape (1,), stride (3,)
            "broadcast": torch.tensor(float(i)).expand(1),  # stride (0,)
            "conj": torch.tensor([1 + 2j, 3j])[::2].conj(),
            "mixed": torch.tensor([200], dtype=torch.uint8) if i % 2 == 0 else torch.tensor([-i]),
        }


def test_one_element_tensors_of_any_stride_cross_a_process_queue():
    m = torch.arange(15).reshape(5, 3)
    items = [m[1:2, 0], m[:1, 1:2].T, torch.tensor(2.5).expand(1), m.T[0, ::5]]
    items += [torch.arange(4, dtype=torch.bfloat16)[1::4], torch.tensor([1 + 2j, 3j])[::2].conj()]
    with ProcessQueue(capacity=len(items)) as queue:
        for tensor in items:
            queue.put(tensor)
        got = [queue.get(timeout=5) for _ in items]
    assert [difference(want, have) for want, have in zip(items, got)] == [None] * len(items)


def as_is(batch):
    return batch


@pytest.mark.timeout(60)
def test_worker_batches_equal_torchs_in_process_batches():
    """A tensor of one element with a stride other than 1 (m[1:2, 0], x.expand(1))
    could not leave a worker process ("self.stride(-1) must be 1 to view Long as
    Byte") where torch's workers send it. And samples of mixed dtypes: torch's
    workers stack into the first sample's dtype (int64 -3 after uint8 becomes 253),
    its main process promotes (-3); pipeloom promotes in workers too, also when
    collate_fn is torch's default_collate itself (which, called in a classic worker,
    gave 253 while economic and chunked gave -3)."""
    samples = [[Rows()[2 * b], Rows()[2 * b + 1]] for b in range(3)]
    expected = [tud.default_collate(batch) for batch in samples]
    assert expected[1]["mixed"].tolist() == [[200], [-3]]  # promoted to int64 in-process
    for collate_fn, want in ((None, expected), (tud.default_collate, expected), (as_is, samples)):
        loader = DataLoader(
            Rows(),
            batch_size=2,
            num_workers=2,
            multiprocessing_context="fork",
            timeout=30,
            collate_fn=collate_fn,
        )
        got = list(loader)
        assert len(got) == 3
        assert [difference(w, g) for w, g in zip(want, got)] == [None] * 3


# -- one pipeline under every reading service ----------------------------------------------


def item(i: int) -> dict[str, Any]:
    m = torch.arange(15).reshape(5, 3) + i
    return {
        "big": torch.full((64, 1024), float(i)),  # 1 MiB batches: shared memory, warm buffers
        "one": m[1:2, 0],
        "T": m.T,
        "a": np.full((2, 3), i, np.int16)[:, ::2],
        "s": f"s{i}",
        "n": i,
        "f": i / 3,
        "bf": torch.full((2,), i / 7, dtype=torch.bfloat16),
        "c": torch.tensor([i + 1j]).conj(),
    }


def every_kind_of_collate(batch: list[Any]) -> tuple[Any, ...]:
    """torch's batch, the samples themselves, a view of an input and plain values;
    then the input list is mutated (as a careless collate_fn might)."""
    collated = default_collate(batch)
    out = (collated, list(batch), batch[0]["big"][1:3], [len(batch), None, "x"])
    batch.reverse()
    batch.append(batch[0])
    return out


SERVICES = {
    "in-process": InProcessReadingService,
    "threads": lambda: ThreadReadingService(2),
    **{
        strategy: lambda strategy=strategy: MultiProcessingReadingService(
            2, strategy=strategy, start_method="fork", timeout=30, persistent_workers=True
        )
        for strategy in ("classic", "economic", "chunked")
    },
}


def as_bytes(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), tuple(value.shape), raw(value))
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, dict):
        return {key: as_bytes(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [as_bytes(v) for v in value])
    return (type(value).__name__, repr(value))


@pytest.mark.timeout(90)
def test_batches_are_byte_identical_under_every_reading_service_while_held():
    expected = None
    for name, service in SERVICES.items():
        pipe = IterableWrapper(range(11)).sharding_filter().map(item).batch(4)
        pipe = pipe.collate(every_kind_of_collate).pin_memory().to_device("cpu")
        with NativeLoader(pipe, service(), seed=0) as loader:
            held = list(loader)  # each batch kept while the later ones are made
            first = [as_bytes(batch) for batch in held]
            again = [as_bytes(batch) for batch in loader]  # the memory of epoch 0, reused
            kept = [as_bytes(batch) for batch in held]
        expected = first if expected is None else expected
        assert [len(batch[1]) for batch in held] == [4, 4, 3], name
        assert first == expected, name
        assert again == expected, name
        assert kept == expected, f"{name}: a held batch changed in the next epoch"


# -- how many batches, of what sizes -------------------------------------------------------


class Shards(tud.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = tud.get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(range(first, self.n, step))


@pytest.mark.timeout(60)
def test_batch_sizes_equal_torchs_with_a_short_last_batch():
    """Map-style: the sampler's batches, the short last one dropped with drop_last,
    under every strategy (economic and chunked batch the items themselves); an
    iterable dataset: each worker's own batches and own short last one, as in
    torch. (A native pipeline gives the in-process batches under every service:
    the test above.)"""

    def sizes(loader):
        return [len(batch) for batch in loader]

    kwargs = {"batch_size": 3, "num_workers": 2, "multiprocessing_context": "fork", "timeout": 30}
    torch_sizes = sizes(tud.DataLoader(list(range(8)), drop_last=True, **kwargs))
    assert torch_sizes == [3, 3]
    for strategy in ("classic", "economic", "chunked"):
        loader = DataLoader(list(range(8)), drop_last=True, strategy=strategy, **kwargs)
        assert sizes(loader) == torch_sizes, strategy
    for drop_last, per_worker in ((False, [3, 3, 1, 1]), (True, [3, 3])):
        torch_shards = sizes(tud.DataLoader(Shards(8), drop_last=drop_last, **kwargs))
        assert torch_shards == per_worker  # worker 0: 0 2 4 | 6, worker 1: 1 3 5 | 7
        assert sizes(DataLoader(Shards(8), drop_last=drop_last, **kwargs)) == torch_shards


def test_ranks_split_whole_batches_and_yield_as_many_each_as_documented():
    """docs/distributed.md, "Uneven ends": not torch's DistributedSampler sizes."""

    def batches(n, size, ranks, uneven):
        def rank(world, index):
            pipe = IterableWrapper(range(n)).sharding_filter().batch(size)
            with NativeLoader(pipe, rank_service(world, index, uneven=uneven), seed=0) as loader:
                return list(loader)

        return ok(run_ranks(ranks, rank))

    assert batches(5, 2, 2, "pad") == [[[0, 1], [4]], [[2, 3], [2, 3]]]
    assert batches(5, 2, 2, "shortest") == [[[0, 1]], [[2, 3]]]
    assert batches(5, 3, 3, "shortest") == [[], [], []]
    sampled = [
        [len(batch) for batch in tud.DataLoader(range(5), batch_size=2, sampler=sampler)]
        for sampler in (tud.DistributedSampler(range(5), 2, r, shuffle=False) for r in (0, 1))
    ]
    assert sampled == [[2, 1], [2, 1]]  # torch: items split, padded from the epoch's start


# -- padding: padded_batch / PadCollate, pack -------------------------------------------------


def test_padding_keeps_every_value_of_entries_of_mixed_dtypes():
    """The padded batch was made in the first entry's dtype: 0.5 after int64 tokens
    became 0, and int64 -3 after a uint8 entry became 253 (collate() promotes)."""
    floats = PadCollate()([torch.tensor([1, 2]), torch.tensor([0.5])]).values
    assert floats.dtype == torch.float32 and floats.tolist() == [[1, 2], [0.5, 0]]
    signed = PadCollate()([torch.tensor([200], dtype=torch.uint8), torch.tensor([-3, 4])])
    assert signed.values.dtype == torch.int64 and signed.values.tolist() == [[200, 0], [-3, 4]]
    (packed,) = collect(IterableWrapper([[5, 6], [0.5]]).pack(4))
    assert packed[0].tolist() == [5, 6, 0.5, 0]
    tokens = [{"ids": np.array([1, 2], np.uint16)}, {"ids": [70000]}]  # 70000 -> 4464 in uint16
    with pytest.raises(TypeError, match=r"'ids' entries have dtypes .* convert them to one"):
        PadCollate()(tokens)


@pytest.mark.parametrize(
    ("pad_value", "dtype"),  # stored as 255, 0, True and inf before
    [(-1, torch.uint8), (0.5, torch.int64), (-1, torch.bool), (1e6, torch.float16)],
)
def test_a_pad_value_the_dtype_cannot_hold_is_refused_not_stored_as_another(pad_value, dtype):
    """pad_value=-1 on uint8 tokens padded them with 255, a valid token, without a word."""
    entries = [torch.ones(1, dtype=dtype), torch.ones(2, dtype=dtype)]
    message = r"pad_value .* does not fit the {} entries, of dtype .* pass a pad_value that"
    with pytest.raises(ValueError, match=message.format("sequence")):
        PadCollate(pad_value=pad_value)(entries)
    with pytest.raises(ValueError, match=message.format("'ids'")):
        PadCollate(pad_value={"ids": pad_value})([{"ids": entry} for entry in entries])
    with pytest.raises(ValueError, match=message.format("sequence")):
        collect(IterableWrapper(entries[1:]).pack(4, pad_value=pad_value))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_nested_tensors_get_torchs_message_not_an_internal_error():
    """Describing the samples asked a nested tensor for its shape, and torch's
    "Batches of nested tensors are not currently supported" became "Internal error:
    NestedTensorImpl doesn't support sizes. Please file an issue."."""
    rows = [torch.ones(2), torch.ones(3)]
    batch = [torch.nested.nested_tensor(rows) for _ in range(2)]
    with pytest.raises(RuntimeError, match="nested tensors are not currently supported"):
        tud.default_collate(batch)
    with pytest.raises(RuntimeError, match="nested tensors are not currently supported"):
        default_collate(batch)
