"""``empty_tensor``: the producer builds an item in the queue's shared memory.

What must hold: the tensor reaches the consumer without a copy, and its
segment is reused only once *both* sides let go of it -- the producer's
tensor (and every view of it) and everything the consumer built from it.
A reused segment under a live tensor would silently change a training batch.
"""

import multiprocessing as mp
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.queues import ALLOCATE_MIN, ProcessQueue, ThreadQueue
from tests.queues import queue_workers

SHAPE = (256, 1024)  # 1 MiB of float32: above ALLOCATE_MIN


def test_a_filled_tensor_crosses_processes_without_a_copy():
    q = ProcessQueue(capacity=2, owner="consumer")
    proc = mp.get_context("fork").Process(target=queue_workers.produce_built, args=(q, 12))
    proc.start()
    got = []
    while len(got) < 12:
        item = q.get(timeout=10)
        got.append((item["i"], float(item["t"].mean()), item["t"].shape))
        del item
    proc.join(10)
    stats = q.statistics()
    q.close()
    assert got == [(i, float(i), torch.Size(SHAPE)) for i in range(12)]
    assert stats.bytes_uncopied == 12 * 4 * 256 * 1024  # not one byte of the tensors copied
    assert stats.segments_created <= 5 and stats.segments_reused >= 7  # pooled, not fresh


def test_small_tensors_and_other_queues_give_plain_tensors():
    with ProcessQueue() as q:
        small = q.empty_tensor((ALLOCATE_MIN // 8,), torch.float32)  # half the minimum
        assert q.statistics().shm_bytes_held == 0
        small.fill_(1)
        q.put(small)
        assert float(q.get(timeout=10).sum()) == ALLOCATE_MIN // 8
    assert ThreadQueue(capacity=1).empty_tensor((3, 2), torch.int64).dtype == torch.int64


def test_segment_waits_for_the_producer_tensor_as_well_as_the_consumer():
    with ProcessQueue(capacity=4) as q:
        kept = q.empty_tensor(SHAPE)
        kept.fill_(7)
        q.put(kept)
        q.get(timeout=10)  # the consumer is done with it at once; the producer is not
        for i in range(6):  # new batches must not land in `kept`'s segment
            t = q.empty_tensor(SHAPE)
            t.fill_(i)
            q.put(t)
            del t
            assert float(q.get(timeout=10).mean()) == i
        assert bool((kept == 7).all())


def test_segment_waits_for_the_consumer_after_the_producer_dropped_it():
    with ProcessQueue(capacity=4) as q:
        t = q.empty_tensor(SHAPE)
        t.fill_(3)
        q.put(t)
        del t
        held = q.get(timeout=10)
        for i in range(6):
            t = q.empty_tensor(SHAPE)
            t.fill_(10 + i)
            q.put(t)
            del t
            assert float(q.get(timeout=10).mean()) == 10 + i
        assert bool((held == 3).all())


def test_a_tensor_put_twice_arrives_twice_and_unbuilt_tensors_return_to_the_pool():
    with ProcessQueue(capacity=4) as q:
        t = q.empty_tensor(SHAPE)
        t.fill_(5)
        q.put({"a": t})
        q.put([t, t[1:]])  # one message, two views of one segment
        first, second = q.get(timeout=10), q.get(timeout=10)
        assert float(first["a"].mean()) == 5 and torch.equal(second[0][1:], second[1])
        del t, first, second
        for _ in range(20):  # allocated, never sent, dropped: back to the pool each time
            q.empty_tensor(SHAPE)
        q.reclaim()
        stats = q.statistics()
        assert stats.segments_created <= 2 and stats.shm_bytes_held <= 2 * (1 << 20)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["build", "build_keep", "get", "get_keep", "get_view", "drop_kept", "put_kept"]
        ),
        min_size=1,
        max_size=40,
    )
)
def test_no_live_tensor_ever_changes_under_any_order_of_builds_gets_and_drops(ops):
    """Property: whatever either side holds keeps its value; nothing is lost."""
    q = ProcessQueue(capacity=64)
    producer_kept: list[tuple[torch.Tensor, float]] = []
    consumer_kept: list[tuple[Any, float]] = []
    sent: list[float] = []
    received: list[float] = []
    value = 0.0
    try:
        for op in ops:
            if op.startswith("build"):
                value += 1
                t = q.empty_tensor((64, 1024))  # 256 KiB: exactly the minimum
                t.fill_(value)
                q.put(t)
                sent.append(value)
                if op == "build_keep":
                    producer_kept.append((t, value))
                del t
            elif op.startswith("get") and len(received) < len(sent):
                item = q.get(timeout=10)
                received.append(float(item[0, 0]))
                if op == "get_keep":
                    consumer_kept.append((item, received[-1]))
                elif op == "get_view":  # a row of it, as a NumPy array: the tensor itself goes
                    consumer_kept.append((item[-1].numpy(), received[-1]))
                del item
            elif op == "drop_kept" and producer_kept:
                producer_kept.pop(0)
            elif op == "put_kept" and producer_kept:
                q.put(producer_kept[0][0])
                sent.append(producer_kept[0][1])
            for tensor, expected in producer_kept + consumer_kept:
                assert bool((tensor == expected).all()), "a live tensor changed under its owner"
        while len(received) < len(sent):
            received.append(float(q.get(timeout=10)[0, 0]))
        assert received == sent
    finally:
        q.close()


@pytest.mark.parametrize(
    "strategy, options",
    [
        ("classic", {}),
        ("economic", {"num_batch_workers": 0}),
        ("economic", {"num_batch_workers": 2}),
    ],
    ids=["classic", "economic-item-workers-collate", "economic-batch-workers"],
)
def test_workers_collate_into_the_output_queue_and_batches_equal_in_process(strategy, options):
    from pipeloom import DataLoader
    from pipeloom.datapipes import SequenceWrapper
    from pipeloom.reading_service import MultiProcessingReadingService

    def pipeline():
        return SequenceWrapper(range(24)).to_iter().map(_big_row).batch(4).collate()

    expected = [b.clone() for b in DataLoader(pipeline())]
    service = MultiProcessingReadingService(2, strategy=strategy, **options)
    loader = DataLoader(pipeline(), reading_service=service)
    got, copied = [], []
    try:
        for batch in loader:
            got.append(batch)
            stats = [q.statistics() for _, q in service.queues()]
            copied.append(sum(s.bytes_via_shm - s.bytes_uncopied for s in stats))
            uncopied = sum(s.bytes_uncopied for s in stats)
    finally:
        loader.shutdown()
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))
    # Collated (and, economic's items to its batch workers, stacked) into shared memory:
    assert uncopied >= 4 * 4 * 128 * 1024 and not any(copied)


def _big_row(i):
    return torch.full((128, 1024), float(i))


def test_economic_shared_memory_stays_flat_as_item_workers_collate():
    """Economic's point: batches in flight bound the memory, not ``num_workers``.

    Item workers collate into their queue to the main process; a worker that kept
    its last batch (or its freed segments) while idle would hold one batch each.
    """
    from pipeloom import DataLoader
    from pipeloom.datapipes import SequenceWrapper
    from pipeloom.reading_service import MultiProcessingReadingService

    batch_bytes = 8 * 256 * 1024  # 8 rows of 256 KiB: a 2 MiB segment per batch
    pipe = SequenceWrapper(range(8 * 48)).to_iter().map(_wide_row).batch(8).collate()
    service = MultiProcessingReadingService(
        8, strategy="economic", num_batch_workers=0, prefetch_factor=2
    )
    loader = DataLoader(pipe, reading_service=service)
    held = []
    try:
        for i, batch in enumerate(loader):
            assert float(batch[0, 0, 0]) == 8 * i
            held.append(sum(q.statistics().shm_bytes_held for _, q in service.queues()))
    finally:
        loader.shutdown()
    assert len(held) == 48
    # 2 in flight, 1 here, the rest on their way back: 4-5 batches at 2 or 8 workers
    assert max(held) <= 6 * batch_bytes, [h // batch_bytes for h in held]


def _wide_row(i):
    return torch.full((64, 1024), float(i))


def test_trim_gives_back_big_free_segments_and_keeps_small_ones():
    with ProcessQueue(capacity=4) as q:
        for i in range(3):
            q.put(torch.full(SHAPE, float(i)))  # 1 MiB: a 1 MiB segment (the stream goes inline)
            q.put(torch.full((4096,), float(i)))  # 16 KiB: a 64 KiB one
            assert float(q.get(timeout=10)[0, 0]) == i and float(q.get(timeout=10)[0]) == i
        q.reclaim()
        before = q.statistics().shm_bytes_held
        q.trim()  # 1 MiB and up
        after = q.statistics().shm_bytes_held
        assert before - after >= 1 << 20  # a big free segment was given back
        assert after % (1 << 20) >= 64 << 10  # small ones stay pooled
        q.put(torch.full(SHAPE, 9.0))  # a fresh segment after the trim
        assert float(q.get(timeout=10)[0, 0]) == 9.0
