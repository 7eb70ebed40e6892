"""Language-model pipelines (mix, pack, bucket, pad) resume exactly, on any worker count.

Three sources are mixed: tar shards read through workers (the sharded,
per-item part), a shuffled in-memory corpus and a plain one (read in the main
process). Then either ``pack`` + ``batch`` + ``collate`` or ``bucket_by_length``
+ ``PadCollate``. A checkpoint at random steps, resumed in a fresh loader under
the same or another service and worker count, gives exactly the rest of the
epoch, and the next epoch.
"""

from __future__ import annotations

import io
import pickle
import random
import tarfile
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader, item_rng
from pipeloom.datapipes import FileLister, IterableWrapper, PadCollate
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)
from tests.datapipes.sequences import plain

SHARDS, DOCS_PER_SHARD = 3, 6


def write_shards(root) -> str:
    """Tar shards of documents: members ``doc<s>_<i>.txt`` holding space-separated token ids."""
    rng = random.Random(0)
    for shard in range(SHARDS):
        with tarfile.open(root / f"shard-{shard}.tar", "w") as tar:
            for i in range(DOCS_PER_SHARD):
                tokens = " ".join(str(rng.randint(1, 999)) for _ in range(rng.randint(1, 40)))
                data = tokens.encode()
                info = tarfile.TarInfo(f"doc{shard}_{i}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(root)


def tokenize_member(member):
    """``(name, bytes)`` -> a document; a random token dropped per doc (item_rng in workers)."""
    _, data = member
    ids = [int(t) for t in data.split()]
    if len(ids) > 2:
        del ids[int(item_rng().integers(len(ids)))]
    return {"input_ids": ids, "labels": ids[1:] + [-100]}


def as_document(ids):
    return {"input_ids": ids, "labels": ids[1:] + [-100]}


def corpus(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(1000, 2000) for _ in range(rng.randint(1, 30))] for _ in range(count)]


def document_length(doc) -> int:
    return len(doc["input_ids"])


def mixed(root: str):
    shards = (
        FileLister(root, "*.tar")
        .sharding_filter()
        .open_files("rb")
        .load_from_tar()
        .map(tokenize_member)
    )
    books = IterableWrapper(corpus(1, 25)).shuffle().map(as_document)
    code = IterableWrapper(corpus(2, 15)).map(as_document)
    return shards.mux(books, code, weights=[2, 1, 1], stop="all")


def packed(root: str):
    return mixed(root).pack(32, buffer_size=4, pad_value={"labels": -100}).batch(3).collate()


def bucketed(root: str):
    return (
        mixed(root)
        .bucket_by_length(document_length, num_buckets=3, max_tokens=96, buffer_size=12)
        .collate(PadCollate(pad_value={"labels": -100}, pad_to_multiple_of=8))
    )


BUILDERS = {"packed": packed, "bucketed": bucketed}

SERVICES = {
    "in-process": lambda: InProcessReadingService(),
    "threads-1": lambda: ThreadReadingService(1),
    "threads-3": lambda: ThreadReadingService(3),
    "processes-2": lambda: MultiProcessingReadingService(2, timeout=60),
    "processes-3": lambda: MultiProcessingReadingService(3, timeout=60),
}
WORKER_SERVICES = sorted(name for name in SERVICES if name != "in-process")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("shards"))


@pytest.fixture(scope="module")
def reference(shards):
    """The in-process epochs 0 and 1 of each pipeline, seed 11."""
    out = {}
    for kind, build in BUILDERS.items():
        with DataLoader(build(shards), seed=11) as loader:
            out[kind] = (plain(list(loader)), plain(list(loader)))
    return out


def stop_and_resume(build, shards, save_service, load_service, step):
    """Read epoch 0 up to ``step``, checkpoint, resume in a fresh loader: (head + rest, next)."""
    with DataLoader(build(shards), SERVICES[save_service](), seed=11) as loader:
        iterator = iter(loader)
        head = [plain(next(iterator)) for _ in range(step)]
        state = pickle.loads(pickle.dumps(loader.state_dict()))
    rest, following = resume_in_a_fresh_thread(build(shards), SERVICES[load_service](), state)
    return head + rest, following


def resume_in_a_fresh_thread(pipe, service, state):
    """The rest of the epoch and the next one, read by a thread that has seen no item yet
    (as a new process would: no per-item stamp is left over from the run that saved)."""
    out: list = []

    def run():
        try:
            with DataLoader(pipe, service, seed=99) as resumed:
                resumed.load_state_dict(state)
                out.append(plain(list(resumed)))
                out.append(plain(list(resumed)))
        except BaseException as error:  # re-raised in the test's thread
            out.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=120)
    if out and isinstance(out[-1], BaseException):
        raise out[-1]
    assert len(out) == 2, "the resumed loader did not finish within 120 s"
    return out[0], out[1]


def test_the_pipelines_mix_all_three_sources_and_every_service_gives_the_same_epochs(
    shards, reference
):
    packed_rows = [row for batch in reference["packed"][0] for row in batch["input_ids"]]
    tokens = [t for row in packed_rows for t in row if t]
    assert any(t < 1000 for t in tokens) and any(1000 <= t <= 2000 for t in tokens)
    assert reference["packed"][0] != reference["packed"][1]  # a new shuffle per epoch
    for kind, build in BUILDERS.items():
        for name in ("threads-3", "processes-2"):
            with DataLoader(build(shards), SERVICES[name](), seed=11) as loader:
                assert (plain(list(loader)), plain(list(loader))) == reference[kind], (kind, name)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("service", sorted(SERVICES))
@pytest.mark.parametrize("kind", sorted(BUILDERS))
@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_checkpoint_at_five_random_steps_resumes_exactly(shards, reference, kind, service, data):
    epoch, following = reference[kind]
    steps = data.draw(st.lists(st.integers(0, len(epoch)), min_size=5, max_size=5), label="steps")
    # One saving loader reads the whole epoch and checkpoints at each step (not a loader
    # per step, stopped there: half the worker pools); each state resumes in a fresh one.
    build = BUILDERS[kind]
    states, got = {}, []
    with DataLoader(build(shards), SERVICES[service](), seed=11) as loader:
        iterator = iter(loader)
        for step in range(len(epoch) + 1):
            if step in steps:
                states[step] = pickle.dumps(loader.state_dict())
            if step < len(epoch):
                got.append(plain(next(iterator)))
        assert next(iterator, None) is None
    assert got == epoch, f"{kind} under {service}: the epoch the states were taken in"
    for step in steps:
        state = pickle.loads(states[step])
        rest, after = resume_in_a_fresh_thread(build(shards), SERVICES[service](), state)
        assert got[:step] + rest == epoch, f"{kind} under {service}, resumed at step {step}"
        assert after == following


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(BUILDERS))
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    save=st.sampled_from(WORKER_SERVICES),
    load=st.sampled_from(WORKER_SERVICES),
    fraction=st.floats(0, 1),
)
def test_a_checkpoint_resumes_on_another_worker_count_and_kind(
    shards, reference, kind, save, load, fraction
):
    epoch, following = reference[kind]
    step = int(fraction * len(epoch))
    resumed, after = stop_and_resume(BUILDERS[kind], shards, save, load, step)
    assert resumed == epoch, f"{kind}: saved under {save}, resumed under {load} at step {step}"
    assert after == following


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("save", "load"), [("processes-2", "threads-1"), ("threads-3", "processes-2")]
)
def test_elastic_resume_between_threads_and_processes_in_the_middle(shards, reference, save, load):
    epoch, following = reference["packed"]
    assert stop_and_resume(packed, shards, save, load, len(epoch) // 2) == (epoch, following)


@pytest.mark.timeout(120)
def test_a_state_saved_in_process_resumes_under_a_worker_service(shards, reference):
    """States are portable: in-process and worker states load into each other."""
    assert stop_and_resume(packed, shards, "in-process", "threads-3", 1) == reference["packed"]
    assert stop_and_resume(packed, shards, "threads-1", "in-process", 2) == reference["packed"]


def books_and_code():
    """The mix before the sharding point: every strategy can then run the per-item work."""
    books = IterableWrapper(corpus(1, 40)).shuffle()
    code = IterableWrapper(corpus(2, 30))
    return (
        books.mux(code, weights=[3, 1], stop="cycle")
        .sharding_filter()
        .map(as_document)
        .batch(4)  # economic and chunked hand out batches; unbatch gives the stream back
        .unbatch()
        .pack(32, pad_value={"labels": -100})
        .batch(2)
        .collate()
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", ["classic", "economic", "chunked"])
def test_a_mix_before_the_sharding_point_runs_and_resumes_under_every_strategy(strategy):
    with DataLoader(books_and_code(), seed=5) as loader:
        epoch, following = plain(list(loader)), plain(list(loader))

    def service(workers):
        return MultiProcessingReadingService(workers, strategy=strategy, timeout=60)

    with DataLoader(books_and_code(), service(2), seed=5) as loader:
        assert plain(list(loader)) == epoch
        loader.set_epoch(0)
        iterator = iter(loader)
        head = [plain(next(iterator)) for _ in range(len(epoch) // 2)]
        state = pickle.loads(pickle.dumps(loader.state_dict()))
    rest, after = resume_in_a_fresh_thread(books_and_code(), service(3), state)  # 2 -> 3
    assert head + rest == epoch and after == following
