"""Worker errors name the real cause, the worker, the block and the item (#14 items 4, 5, 7).

Every test also checks that nothing else was printed to stderr (by this
process or its workers): a message is the only report of a failure.
"""

from __future__ import annotations

import os
import re
import threading
import traceback

import pytest
import torch
import torch.utils.data
from hypothesis import given
from hypothesis import strategies as st

import pipeloom.compat
from pipeloom import DataLoader
from pipeloom.datapipes import IterableWrapper, SequenceWrapper
from pipeloom.errors import WorkerError
from pipeloom.queues import PayloadError
from pipeloom.reading_service import MultiProcessingReadingService, ThreadReadingService
from pipeloom.reading_service.workers.failure import describe_item
from tests.reading_service import pipelines

STRATEGIES = ["classic", "economic", "chunked"]


def holds_a_lock(x):
    return {"x": x, "lock": threading.Lock()} if x == 5 else {"x": x}


def requires_grad(x):
    return torch.ones(3, requires_grad=x == 5)


def build(fn, strategy: str, n: int = 12):
    if strategy == "economic":  # economic assigns items by index: a map-style source
        source = SequenceWrapper(list(range(n))).to_iter()
    else:
        source = IterableWrapper(range(n)).shuffle().sharding_filter()
    return source.map(fn).batch(2)


def formatted(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("fn", "kind", "match"),
    [
        (
            holds_a_lock,
            TypeError,
            r"type '(dict|list)': it is not picklable \(cannot pickle '_thread.lock",
        ),
        (requires_grad, PayloadError, r"cannot send a tensor that requires grad.*detach\(\)"),
    ],
    ids=["lock", "requires-grad"],
)
@pytest.mark.parametrize(
    ("strategy", "extra"),
    [*((name, {}) for name in STRATEGIES), ("economic", {"num_batch_workers": 2})],
    ids=[*STRATEGIES, "economic-batch-workers"],
)
def test_an_output_that_cannot_cross_processes_is_reported_with_its_cause(
    strategy, extra, fn, kind, match, capfd
):
    service = MultiProcessingReadingService(2, strategy=strategy, **extra)
    with DataLoader(build(fn, strategy), service, seed=0) as loader:
        with pytest.raises(kind, match=match) as info:
            list(loader)
    origin = info.value.__cause__
    assert isinstance(origin, WorkerError)
    assert origin.worker is not None and "worker" in origin.worker
    assert origin.block is not None and origin.block.startswith(("Mapper", "Batcher"))
    assert origin.item is not None and origin.item_repr is not None
    if service.num_batch_workers:  # item workers send items (else whole batches)
        assert "'x': 5" in origin.item_repr or "shape=(3,)" in origin.item_repr
    text = formatted(info.value)
    assert "exited with code" not in text and "prefetch_factor" not in text
    assert f"{kind.__name__}: {kind.__name__}:" not in text
    assert capfd.readouterr().err == ""


def exit_with_code_3(x):
    if x == 3:
        os._exit(3)
    return x


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_worker_exiting_with_a_code_is_not_blamed_on_memory(strategy):
    service = MultiProcessingReadingService(2, strategy=strategy)
    with DataLoader(build(exit_with_code_3, strategy), service, seed=0) as loader:
        with pytest.raises(WorkerError, match=r"exited with code 3 before finishing") as info:
            list(loader)
    assert "memory" not in str(info.value) and "prefetch_factor" not in str(info.value)
    # what ends a worker without an error reported
    assert "it reported no error: code it ran ended the process (os._exit()" in str(info.value)
    assert info.value.exit_code == 3


def fails_on_sample_7(sample):
    if sample["__key__"] == "sample-00007":
        raise ValueError("bad label")
    return sample


@pytest.mark.timeout(60)
@pytest.mark.parametrize("service", ["threads", "classic", "economic"])
def test_a_worker_error_names_the_items_position_and_key(service):
    samples = [{"__key__": f"sample-{i:05d}", "data": bytes(10_000)} for i in range(12)]
    services = {
        "threads": lambda: ThreadReadingService(2),
        "classic": lambda: MultiProcessingReadingService(2),
        "economic": lambda: MultiProcessingReadingService(2, strategy="economic"),
    }
    if service == "economic":
        source = SequenceWrapper(samples).to_iter()
    else:
        source = IterableWrapper(samples).sharding_filter()
    pipeline = source.map(fails_on_sample_7).batch(2)
    with DataLoader(pipeline, services[service](), seed=0) as loader:
        with pytest.raises(ValueError, match="bad label") as info:
            list(loader)
    origin = info.value.__cause__
    assert isinstance(origin, WorkerError)
    assert origin.item == 7
    assert origin.item_repr == "with __key__ 'sample-00007'"
    assert "item at position 7, item with __key__ 'sample-00007'" in str(info.value)
    assert str(info.value).startswith("bad label\n")  # no "ValueError: ValueError:"


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_describe_item_is_short_and_never_raises():
    assert describe_item(BadRepr()).startswith("<BadRepr ")
    assert (
        describe_item(torch.zeros(3, 224, 224))
        == "Tensor(shape=(3, 224, 224), dtype=torch.float32)"
    )
    assert len(describe_item("x" * 10**6)) <= 120
    assert describe_item({"__key__": "a/b", "jpg": b"\0" * 10**6}) == "with __key__ 'a/b'"


@given(
    st.recursive(
        st.none() | st.integers() | st.text() | st.binary() | st.floats(),
        lambda children: st.lists(children) | st.dictionaries(st.text(), children),
        max_leaves=50,
    )
)
def test_describe_item_is_bounded_for_any_nested_item(item):
    assert 0 < len(describe_item(item)) <= 120


def init_fails_in_worker_0(index):
    if index == 0:
        raise KeyError("no setting 'path'\nset it in the config")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True], ids=["", "persistent"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_key_error_from_worker_init_fn_reads_as_written(strategy, persistent, capfd):
    service = MultiProcessingReadingService(
        3, strategy=strategy, worker_init_fn=init_fails_in_worker_0, persistent_workers=persistent
    )
    with DataLoader(build(pipelines.draw, strategy, n=300), service, seed=0) as loader:
        with pytest.raises(KeyError) as info:
            list(loader)
    message = str(info.value)
    assert message.startswith("no setting 'path'\nset it in the config\n  raised in ")
    assert "in worker_init_fn(0)" in message
    assert type(info.value).__name__ == "KeyError"
    assert "KeyError: KeyError" not in formatted(info.value)
    assert capfd.readouterr().err == ""  # siblings of the failed worker print nothing


class Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 400

    def __getitem__(self, index: int) -> int:
        return index


LOADERS = {
    "in-process": lambda: DataLoader(pipelines.for_strategies(400, batch=2), seed=0),
    "threads": lambda: DataLoader(
        pipelines.for_strategies(400, batch=2), ThreadReadingService(2), seed=0
    ),
    "classic": lambda: DataLoader(
        pipelines.for_strategies(400, batch=2), MultiProcessingReadingService(2), seed=0
    ),
    "compat": lambda: pipeloom.compat.DataLoader(Numbers(), batch_size=2, num_workers=2),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(LOADERS))
def test_one_iterator_read_from_two_threads_delivers_each_item_once(name):
    loader = LOADERS[name]()
    iterator = iter(loader)
    got: list = []
    errors: list = []

    def consume() -> None:
        try:
            for batch in iterator:
                got.append(batch)
        except Exception as error:  # noqa: BLE001 - reported by the assert below
            errors.append(error)

    threads = [threading.Thread(target=consume) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=50)
    assert errors == []
    assert len(got) == 200
    flat = sorted(int(x) for batch in got for x in (batch if name == "compat" else batch[0]))
    assert flat == list(range(400))
    if hasattr(loader, "shutdown"):
        loader.shutdown()


def first_byte(path_and_stream):
    return path_and_stream[1].read(1)


@pytest.mark.timeout(60)
def test_chunked_names_the_sharding_point_when_its_items_cannot_cross(tmp_path):
    from pipeloom.datapipes import FileLister

    for i in range(4):
        (tmp_path / f"{i}.bin").write_bytes(bytes([i]))
    pipe = FileLister(str(tmp_path), "*.bin").open_files("rb").map(first_byte).batch(2)
    service = MultiProcessingReadingService(2, strategy="chunked")
    with DataLoader(pipe, service, seed=0) as loader:
        with pytest.raises(
            TypeError,
            match=r"the items of the sharding point cross from the main process to the workers"
            r".*BufferedReader.*open or decode after the sharding point",
        ):
            list(loader)


def test_next_called_from_inside_the_pipeline_says_what_happened():
    holder = {}

    def reenter(x):
        if x == 2:
            next(holder["iterator"])
        return x

    loader = DataLoader(IterableWrapper(range(5)).map(reenter), seed=0)
    holder["iterator"] = iterator = iter(loader)
    assert [next(iterator), next(iterator)] == [0, 1]
    with pytest.raises(
        RuntimeError,
        match=r"next\(\) was called on this iterator over epoch 0 while a next\(\) on it was "
        r"still running in the same thread .*call next\(\) from the training loop only",
    ):
        next(iterator)
    loader.shutdown()


def fails_on_3(x):
    if x == 3:
        raise ValueError("bad item")
    return x


@pytest.mark.timeout(60)
@pytest.mark.parametrize("service", ["in-process", "classic", "economic", "chunked"])
def test_an_error_before_the_sharding_point_names_the_block_and_the_item(service):
    pipe = IterableWrapper(range(8)).map(fails_on_3).sharding_filter().batch(2)
    reading = (
        None if service == "in-process" else MultiProcessingReadingService(2, strategy=service)
    )
    with DataLoader(pipe, reading, seed=0) as loader:
        with pytest.raises(ValueError, match="bad item") as info:
            list(loader)
    text = formatted(info.value)
    assert "Mapper(fn=fails_on_3) on the item at position 3" in text or service == "classic"
    if service == "in-process":
        return
    # classic: each worker runs the part before the sharding point; economic and chunked:
    # the main process does, and names the block and the item as a worker does
    where = r"worker process \d \(pid \d+\)" if service == "classic" else "the main process"
    origin = rf"raised in {where}, block Mapper\(fn=fails_on_3\), item at position 3, item 3"
    assert re.search(origin, text), text
