"""Attacks on the queues from the outside: odd payloads, long-lived zero-copy items, dead peers.

Every payload must arrive equal (type, dtype, shape, values) or be refused at
``put`` with a clear error; a received tensor or array, or anything built from
it, must never change while later items reuse the shared memory.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.queues import ALLOCATE_MIN, ProcessQueue

# The edges docs/queues.md names: buffers under 8 KiB stay in the pickle stream,
# streams over 64 KiB go to shared memory.
INBAND_MAX = 8 * 1024
INLINE_MAX = 64 * 1024


def _round_trip(item):
    with ProcessQueue(capacity=2) as q:
        q.put(item, timeout=5)
        return q.get(timeout=5)


def _assert_same_array(sent: np.ndarray, got: np.ndarray) -> None:
    assert type(got) is type(sent)
    assert (got.dtype, got.shape) == (sent.dtype, sent.shape)
    assert got.tobytes() == sent.tobytes()


# -- odd payloads -------------------------------------------------------------

ARRAY_DTYPES = [
    "M8[D]",  # NumPy exports no buffer of datetime64/timedelta64 ...
    "m8[ns]",
    np.dtype([]),  # ... and a zero-size item has no bytes at all
    "V0",
    ">i4",
    ">f8",
    "<c16",
    "V7",
    np.dtype([("a", "<i4"), ("b", ">f8"), ("c", "S3")]),
    "S5",
    "U3",
    np.longdouble,
    np.float16,
    np.bool_,
]


@pytest.mark.parametrize("count", [5, 3000], ids=["in-stream", "in-shm"])
@pytest.mark.parametrize("dtype", ARRAY_DTYPES, ids=str)
def test_arrays_of_every_plain_dtype_arrive_equal(dtype, count):
    sent = np.zeros((count, 2), dtype=dtype)
    if sent.itemsize:  # every byte different from its neighbours
        sent.view(np.uint8).reshape(-1)[:] = np.arange(sent.nbytes) % 251
    if sent.dtype.kind in "Mm":
        sent = np.arange(2 * count).reshape(count, 2).astype(dtype)
    got = _round_trip({"a": sent[::-1]})["a"]
    _assert_same_array(sent[::-1], got)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("count", [5, 3000], ids=["in-stream", "in-shm"])
def test_nested_tensors_arrive_equal(count):
    parts = [torch.arange(float(count)), torch.arange(2.0 * count)]
    got = _round_trip(torch.nested.nested_tensor(parts))
    assert got.is_nested
    assert all(torch.equal(a, b) for a, b in zip(got.unbind(), parts, strict=True))


def _tensors(n: int) -> list[torch.Tensor]:
    base = torch.arange(4.0 * n).reshape(n, 4)
    return [
        base.T,
        base.flip(0),
        base.view(-1)[3 : 3 + n],  # a storage offset
        torch.arange(4.0).expand(n, 4),  # stride 0
        torch.complex(base, -base).conj(),  # the conjugate bit
        torch.neg(torch.complex(base, base).conj()),  # the negative bit
        torch.arange(8.0 * n).reshape(n, 2, 2, 2).to(memory_format=torch.channels_last),
        base.to(torch.bfloat16),
        base.to(torch.uint16),
        base.to(torch.float8_e4m3fn),
        (base.to(torch.int64) % 3) == 0,
        base.to_sparse(),
        base.to_sparse_csr(),
        torch.nn.Parameter(base.clone(), requires_grad=False),
    ]


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("n", [3, 3000], ids=["in-stream", "in-shm"])
def test_odd_tensors_arrive_bit_equal(n):
    sent = _tensors(n)
    got = _round_trip(sent)
    for a, b in zip(sent, got, strict=True):
        assert (type(b), b.dtype, b.shape, b.layout) == (type(a), a.dtype, a.shape, a.layout)
        a, b = a.to_dense().resolve_conj().resolve_neg(), b.to_dense().resolve_conj()
        assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@given(
    size=st.sampled_from([INBAND_MAX, INLINE_MAX]).flatmap(
        lambda edge: st.integers(edge - 2, edge + 2)
    ),
    kind=st.sampled_from(["bytes", "bytearray", "uint8", "str", "pair"]),
)
@settings(max_examples=25, deadline=None)
def test_items_at_the_size_edges_arrive_equal(size, kind):
    raw = (np.arange(size) % 253).astype(np.uint8)
    sent = {
        "bytes": raw.tobytes(),
        "bytearray": bytearray(raw.tobytes()),
        "uint8": raw,
        "str": "é" * (size // 2),
        "pair": [raw, raw.tobytes()],
    }[kind]
    got = _round_trip(sent)
    if kind == "uint8":
        _assert_same_array(sent, got)
    elif kind == "pair":
        _assert_same_array(sent[0], got[0])
        assert got[1] == sent[1]
    else:
        assert type(got) is type(sent) and got == sent


def test_a_message_may_refer_to_more_segments_than_one_frame_carries():
    """A batch of many fields, each built in shared memory: every one arrives, and later too."""
    with ProcessQueue(capacity=2) as q:
        numel = ALLOCATE_MIN // 4
        fields = [q.empty_tensor((numel,), torch.float32).fill_(i) for i in range(130)]
        q.put(fields, timeout=5)
        got = q.get(timeout=5)
        assert [float(t[-1]) for t in got] == [float(i) for i in range(130)]
        q.put([fields[129], fields[3]], timeout=5)
        assert [float(t[0]) for t in q.get(timeout=5)] == [129.0, 3.0]
