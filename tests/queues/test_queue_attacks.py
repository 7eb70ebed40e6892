"""Attacks on the queues from the outside: odd payloads, long-lived zero-copy items, dead peers.

Every payload must arrive equal (type, dtype, shape, values) or be refused at
``put`` with a clear error; a received tensor or array, or anything built from
it, must never change while later items reuse the shared memory.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import resource
import signal
import threading

import numpy as np
import psutil
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.errors import NotAvailable
from pipeloom.events import Waiter
from pipeloom.queues import ALLOCATE_MIN, ProcessQueue, QueueBroken, QueueClosed
from tests.queues import queue_workers

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


MEMORYVIEWS = {
    "bytes": lambda n: memoryview(bytes(range(256)) * n),  # read-only
    "bytearray": lambda n: memoryview(bytearray(range(256)) * n),
    "int32-2d": lambda n: memoryview(np.arange(64 * n, dtype=np.int32).reshape(8 * n, 8)),
    "strided": lambda n: memoryview(np.arange(64.0 * n).reshape(8 * n, 8))[::2],
    "big-endian": lambda n: memoryview(np.arange(64 * n, dtype=">i4")),
    "struct": lambda n: memoryview(np.zeros(64 * n, dtype=[("a", "<i4"), ("b", ">f8")])),
    "float16": lambda n: memoryview(np.arange(64 * n, dtype=np.float16)),
    "0-d": lambda n: memoryview(np.array(2.5)),
    "empty-2d": lambda n: memoryview(np.zeros((0, n))),
}


@pytest.mark.parametrize("n", [1, 300], ids=["in-stream", "in-shm"])
@pytest.mark.parametrize("kind", list(MEMORYVIEWS))
def test_memoryviews_arrive_as_memoryviews_of_the_same_format_and_shape(kind, n):
    sent = MEMORYVIEWS[kind](n)
    got = _round_trip({"v": sent})["v"]
    assert type(got) is memoryview
    assert (got.format, got.shape, got.readonly) == (sent.format, sent.shape, sent.readonly)
    assert got.tobytes() == sent.tobytes()


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


@pytest.mark.parametrize("n", [10, 30_000], ids=["in-stream", "in-shm"])
def test_views_of_one_storage_arrive_as_views_of_one_storage(n):
    base = torch.arange(2.0 * n)
    array = np.arange(3.0 * n).reshape(3, n)
    sent = {
        "halves": (base[:n], base[n:]),
        "bits": base.view(torch.int32)[::3],  # another dtype, a stride
        "array": array,
        "transposed": array.T,
        "flipped": array[::-1, 1:],
    }
    with ProcessQueue(capacity=2) as q:
        q.put(sent, timeout=5)
        got = q.get(timeout=5)
        assert q.statistics().bytes_via_shm < 2.5 * 8 * n + 3 * 8 * n + 4096  # each once
    first, second = got["halves"]
    assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
    assert second.storage_offset() == n and got["bits"].stride() == (3,)
    assert np.shares_memory(got["array"], got["transposed"])
    assert got["flipped"].strides == sent["flipped"].strides
    for key in ("bits", "transposed", "flipped"):
        assert np.array_equal(np.asarray(got[key]), np.asarray(sent[key])), key
    first[0], got["array"][2, 1] = -1.0, -2.0  # one write shows in every view, as it did
    assert float(got["bits"][0].view(torch.float32)) == -1.0
    assert got["transposed"][1, 2] == got["flipped"][0, 0] == -2.0


def test_a_message_may_refer_to_more_segments_than_one_frame_carries():
    """A batch of many fields, each built in shared memory: every one arrives, and later too."""
    with ProcessQueue(capacity=2) as q:
        numel = ALLOCATE_MIN // 4
        fields = [q.empty_tensor((numel,), torch.float32).fill_(i) for i in range(70)]
        q.put(fields, timeout=5)
        got = q.get(timeout=5)
        assert [float(t[-1]) for t in got] == [float(i) for i in range(70)]
        q.put([fields[69], fields[3]], timeout=5)
        assert [float(t[0]) for t in q.get(timeout=5)] == [69.0, 3.0]


# -- lifetime of zero-copy items --------------------------------------------------

SIZES = [3_000, 20_000, 70_000, 300_000]  # bytes: in the stream, then three size classes


def _payload(i: int, q: ProcessQueue | None = None) -> dict:
    n = SIZES[i % len(SIZES)] // 4
    shared = torch.arange(2 * n, dtype=torch.float32) + i
    item = {
        "t": torch.full((n,), float(i)),
        "a": np.full(n // 2 + 1, i, dtype=np.int32),
        "pair": (shared[:n], shared[n:]),  # one storage, two offsets
        "deep": [[{"x": np.full(n, -i, dtype=np.float64)}]],
    }
    if q is not None and i % 4 == 0:
        item["built"] = q.empty_tensor((ALLOCATE_MIN // 4,), torch.float32).fill_(i + 0.5)
    return item


def _derive(item: dict) -> dict:
    """What a consumer may keep of an item: views, slices, conversions, nested elements."""
    kept = {
        "numpy": item["t"].numpy(),
        "slice": item["t"][1:5],
        "memoryview": memoryview(item["a"])[2:7],
        "element": item["deep"][0][0]["x"][3:],
        "second": item["pair"][1],
        "reinterpreted": item["t"].view(torch.int32)[::7],
    }
    if "built" in item:
        kept["built"] = item["built"][100:]
    return kept


def _check(i: int, kept: dict) -> None:
    n = SIZES[i % len(SIZES)] // 4
    assert (kept["numpy"] == i).all() and (kept["slice"] == i).all(), i
    assert kept["memoryview"].tolist() == [i] * 5, i
    assert (kept["element"] == -i).all(), i
    assert torch.equal(kept["second"], torch.arange(n, 2.0 * n) + i), i
    assert (kept["reinterpreted"] == torch.tensor(float(i)).view(torch.int32)).all(), i
    if "built" in kept:
        assert (kept["built"] == i + 0.5).all(), i


def _produce_and_scribble(q: ProcessQueue, count: int) -> None:
    torch.set_num_threads(1)
    for i in range(count):
        item = _payload(i, q)
        q.put(item, timeout=10)
        item["t"].fill_(-7)  # the producer reuses its buffers at once
        item["a"][:] = -7
        item["deep"][0][0]["x"][:] = -7
        del item
    q.close()


def test_what_a_consumer_keeps_never_changes_while_hundreds_of_items_follow():
    q = ProcessQueue(capacity=2, owner="consumer")
    proc = mp.get_context("fork").Process(target=_produce_and_scribble, args=(q, 120))
    proc.start()
    kept, in_flight = [], []
    for i in range(120):
        item = q.get(timeout=10)
        in_flight.append(q.qsize())
        if i < 25 or i % 17 == 0:
            kept.append((i, _derive(item)))
        del item
        if i % 25 == 0:
            gc.collect()
    with pytest.raises(QueueClosed):
        q.get(timeout=10)
    proc.join(10)
    stats = q.statistics()
    q.close()
    for i, derived in kept:
        _check(i, derived)
    assert stats.segments_reused > 60  # the memory was reused around what was kept
    assert max(in_flight) <= q.capacity


@given(
    steps=st.lists(
        st.tuples(st.sampled_from([0, 0, 1, 1, 2, 3]), st.integers(1, 2)), min_size=5, max_size=30
    )
)
@settings(max_examples=10, deadline=None)
def test_kept_items_survive_any_order_of_puts_gets_and_drops(steps):
    """0: put, 1: get and keep what is derived, 2: get and drop, 3: drop the oldest kept.

    Two size classes only, so that segments are reused often.
    """
    with ProcessQueue(capacity=3) as q:
        sent = received = 0
        kept: list[tuple[int, dict]] = []
        for op, size in steps:
            if op == 0 and q.qsize() < q.capacity:
                index = sent * len(SIZES) + size  # its size class: SIZES[index % len(SIZES)]
                q.put(_payload(index, q), timeout=5)
                sent += 1
            elif op in (1, 2) and received < sent:
                item = q.get(timeout=5)
                if op == 1:
                    kept.append((item["a"][0].item(), _derive(item)))
                received += 1
                del item
            elif op == 3 and kept:
                kept.pop(0)
            for i, derived in kept:
                _check(i, derived)


# -- peers killed mid-message ---------------------------------------------------------


def _put_big_items_forever(q: ProcessQueue) -> None:
    torch.set_num_threads(1)
    big = np.ones(4 << 20, dtype=np.float64)  # 32 MiB: killed while copying one, likely
    while True:
        q.put([big, np.ones(3)], timeout=10)


def test_producer_killed_while_writing_a_segment_breaks_the_consumer_and_leaves_nothing(
    no_shm_leak,
):
    q = ProcessQueue(capacity=1, owner="consumer")
    proc = mp.get_context("fork").Process(target=_put_big_items_forever, args=(q,))
    proc.start()
    first = q.get(timeout=10)
    os.kill(proc.pid, signal.SIGKILL)  # it is making room for, or copying, the next one
    got = [first]
    with pytest.raises(QueueBroken, match=f"producer process {proc.pid} .*SIGKILL"):
        while True:
            got.append(q.get(timeout=10))
    proc.join(10)
    q.close()
    assert all(item[0].sum() == 4 << 20 and item[1].sum() == 3 for item in got)  # none torn


def _get_keep_and_die(q: ProcessQueue, ready) -> None:
    kept = [q.get(timeout=10) for _ in range(2)]
    ready.set()
    assert kept
    os.kill(os.getpid(), signal.SIGKILL)


def test_consumer_killed_while_holding_built_tensors_breaks_a_blocked_producer(no_shm_leak):
    q = ProcessQueue(capacity=1, owner="producer")
    ready = mp.get_context("fork").Event()
    proc = mp.get_context("fork").Process(target=_get_keep_and_die, args=(q, ready))
    proc.start()
    with pytest.raises(QueueBroken, match=f"consumer process {proc.pid} .*SIGKILL"):
        for i in range(10):  # the third put waits for room the dead consumer never makes
            built = q.empty_tensor((ALLOCATE_MIN // 4,), torch.float32).fill_(i)
            q.put(built, timeout=10)
            del built
    assert ready.is_set()
    proc.join(10)
    q.close()


# -- no shared memory to be had -------------------------------------------------------


def _put_beyond_the_memory_limit(q: ProcessQueue) -> None:
    big = np.ones(16 << 20, dtype=np.uint8)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    headroom = psutil.Process().memory_info().vms + (8 << 20)  # no room for a 16 MiB segment
    resource.setrlimit(resource.RLIMIT_AS, (headroom, hard))
    for _ in range(q.capacity + 1):  # more failures than the queue has room
        try:
            q.put(big, timeout=5)
            q.put("sent", timeout=5)
        except Exception as error:  # noqa: BLE001 - reported to the test
            q.put(f"{type(error).__name__}: {error}", timeout=5)
    q.close()


def test_a_put_refused_shared_memory_says_so_and_leaves_the_queue_usable():
    q = ProcessQueue(capacity=2, owner="consumer")
    proc = mp.get_context("fork").Process(target=_put_beyond_the_memory_limit, args=(q,))
    proc.start()
    got = []
    with pytest.raises(QueueClosed):
        while True:
            got.append(q.get(timeout=10))
    proc.join(10)
    q.close()
    assert len(got) == 3, got
    for report in got:
        assert report.startswith("OSError: [Errno 12] ProcessQueue: the system refused"), report
        assert "nothing was sent and the queue stays usable" in report


def _get_under_a_memory_limit(q: ProcessQueue, out) -> None:
    torch.set_num_threads(1)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    headroom = psutil.Process().memory_info().vms + (16 << 20)  # too little for 32 MiB
    resource.setrlimit(resource.RLIMIT_AS, (headroom, hard))
    for _ in range(3):
        try:
            out.put([float(t[0]) for t in q.get(timeout=10)])
        except Exception as error:  # noqa: BLE001 - reported to the test
            out.put(f"{type(error).__name__}: {error} {getattr(error, '__notes__', '')}")
    q.close()


def test_a_segment_the_consumer_cannot_map_loses_its_item_and_no_other():
    """The next messages' descriptors must not shift onto the lost one's segments."""
    ctx = mp.get_context("fork")
    q = ProcessQueue(capacity=4, owner="producer")
    out = ctx.SimpleQueue()
    proc = ctx.Process(target=_get_under_a_memory_limit, args=(q, out))
    proc.start()
    small = (ALLOCATE_MIN // 4,)
    for values in [(1.0, 2.0), (7.0,), (8.0,)]:  # 32 MiB and 256 KiB, then 256 KiB twice
        shapes = [((32 << 20) // 4,), small] if len(values) == 2 else [small]
        q.put([q.empty_tensor(s).fill_(v) for s, v in zip(shapes, values, strict=True)])
    reports = [out.get() for _ in range(3)]
    proc.join(10)
    q.close()
    assert reports[1:] == [[7.0], [8.0]]  # not the lost item's 256 KiB tensor (2.0)
    assert reports[0].startswith("OSError: [Errno 12]") and "that item is lost" in reports[0]


# -- a full socket ---------------------------------------------------------------------

LINE = "x" * 60_000  # one item, sent through the socket itself


def _put_until_it_fails(q: ProcessQueue, timeout: float, outcome: list) -> None:
    try:
        while True:
            q.put(LINE, timeout=timeout)
            outcome.append("put")
    except Exception as error:  # noqa: BLE001 - reported to the test
        outcome.append((type(error), str(error)))  # not the error: no cycle through its frames


def test_put_times_out_when_the_consumer_does_not_read_even_with_room_left():
    """The items fit the capacity, their bytes not the socket: the timeout still holds."""
    with ProcessQueue(capacity=1000) as q:
        outcome: list = []
        putter = threading.Thread(target=_put_until_it_fails, args=(q, 0.2, outcome))
        putter.start()
        putter.join(10)
        stuck = putter.is_alive()
        while putter.is_alive():  # without a timeout the put waits for us: read, let it end
            q.get(timeout=1)
            q.close()
        assert not stuck and outcome[-1][0] is TimeoutError
        assert "the consumer is not reading" in outcome[-1][1]
        sent = len(outcome) - 1
        assert q.qsize() == sent  # the item that timed out takes no room
        assert all(q.get(timeout=5) == LINE for _ in range(sent))  # whole, none torn
        q.put("after", timeout=5)
        assert q.get(timeout=5) == "after"
    # and close() returned although the socket had been full: the consumer is this process


def _wait_for(stop) -> None:
    stop.wait(30)


def test_producer_blocked_on_a_full_socket_sees_the_consumer_die_though_a_sibling_holds_it():
    ctx = mp.get_context("fork")
    q = ProcessQueue(capacity=1000, owner="producer")
    stop, ready = ctx.Event(), ctx.Event()
    sibling = ctx.Process(target=_wait_for, args=(stop,))  # holds a copy of the consumer's end
    sibling.start()
    consumer = ctx.Process(target=queue_workers.consume_then_die, args=(q, 1, ready))
    consumer.start()
    outcome: list = []
    putter = threading.Thread(target=_put_until_it_fails, args=(q, 10, outcome))
    putter.start()
    putter.join(10)
    stuck = putter.is_alive()
    stop.set()  # the sibling ends: the put sees end-of-file at last
    putter.join(10)
    sibling.join(10)
    consumer.join(10)
    q.close()
    assert not stuck, "put() never noticed that its consumer was killed"
    assert outcome[-1][0] is QueueBroken
    assert f"consumer process {consumer.pid} was killed by signal 9 (SIGKILL)" in outcome[-1][1]


def _fill_the_socket_then_put(q: ProcessQueue, full: threading.Event, outcome: list) -> None:
    try:
        while True:
            q.put(LINE, block=False)
    except NotAvailable:  # the socket is full (the capacity is far from it)
        full.set()
    try:
        q.put(LINE)  # no timeout: only the close can end it
        outcome.append("put")
    except Exception as error:  # noqa: BLE001 - reported to the test
        outcome.append((type(error), str(error)))  # not the error: no cycle through its frames


def test_close_from_another_thread_wakes_a_put_waiting_for_room_in_the_socket():
    q = ProcessQueue(capacity=1000)
    q.readiness()  # the consumer end is this thread's, which never reads
    full, outcome = threading.Event(), []
    putter = threading.Thread(target=_fill_the_socket_then_put, args=(q, full, outcome))
    putter.start()
    assert full.wait(10)
    q.close()
    putter.join(10)
    assert not putter.is_alive() and outcome[-1][0] is QueueClosed, outcome


def _fill_the_socket_then_close(q: ProcessQueue, closed: threading.Event) -> None:
    with contextlib.suppress(NotAvailable):
        while True:
            q.put(LINE, block=False)
    q.close()
    closed.set()


def test_closing_a_full_queue_nobody_reads_yet_returns():
    q, closed = ProcessQueue(capacity=1000), threading.Event()
    threading.Thread(target=_fill_the_socket_then_close, args=(q, closed), daemon=True).start()
    assert closed.wait(10), "close() waited for a consumer that is not there"


def test_space_readiness_fires_when_the_consumer_reads_a_full_socket():
    """A producer that waits on space_readiness after NotAvailable is woken by a get."""
    q = ProcessQueue(capacity=1000)
    q.readiness()
    with contextlib.suppress(NotAvailable):
        while True:
            q.put(LINE, block=False)
    q.reclaim()  # read what the consumer sent so far (its hello)
    waiter = Waiter()
    q.space_readiness().attach(waiter)
    seen = waiter.generation
    with pytest.raises(NotAvailable, match="socket is full"):
        q.put(LINE, block=False)
    q.get(timeout=5)  # room in the socket: the producer must hear of it
    assert waiter.wait(seen, timeout=5), "space_readiness never fired"
    q.put(LINE, block=False)
    waiter.close()
    q.close()
