"""A state loads only into the pipeline and dataset it was saved from (or with strict=False)."""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import torch

from pipeloom import DataLoader
from pipeloom._fingerprint import pipeline_fingerprint
from pipeloom.datapipes import FileLister, IterableWrapper, SequenceWrapper
from pipeloom.errors import StateError
from pipeloom.reading_service import ThreadReadingService


def mid_epoch_state(pipe, service=None, steps=3):
    with DataLoader(pipe, service, seed=0) as loader:
        iterator = iter(loader)
        for _ in range(steps):
            next(iterator)
        return loader.state_dict()


def test_a_state_over_range_200_is_refused_by_the_same_pipeline_over_range_50():
    state = mid_epoch_state(IterableWrapper(range(200)).shuffle(buffer_size=8).batch(4))
    smaller = DataLoader(IterableWrapper(range(50)).shuffle(buffer_size=8).batch(4), seed=0)
    with pytest.raises(
        StateError,
        match=r"(?s)different pipeline or dataset.*block #2 IterableWrapper: saved "
        r"iterable=range\(0, 200\), now range\(0, 50\).*load_state_dict\(state, strict=False\)",
    ):
        smaller.load_state_dict(state)


def test_the_message_names_the_argument_that_changed():
    state = mid_epoch_state(IterableWrapper(list(range(60))).shuffle(buffer_size=10).batch(4))
    other = DataLoader(IterableWrapper(list(range(40))).shuffle(buffer_size=5).batch(4), seed=0)
    with pytest.raises(StateError) as raised:
        other.load_state_dict(state)
    message = str(raised.value)
    assert "block #1 Shuffler: saved buffer_size=10, now 5" in message
    assert "block #2 IterableWrapper: saved iterable=list of 60 items, now list of 40 items" in (
        message
    )


def test_the_arguments_a_partial_binds_are_compared():
    # ``map(partial(crop, 224))`` saved and resumed as ``partial(crop, 128)`` used
    # to load silently: partials were described by their function alone.
    def pipe(*args, **keywords):
        return IterableWrapper(range(20)).map(functools.partial(scale, *args, **keywords)).batch(4)

    state = mid_epoch_state(pipe(2))
    for other, shown in [((3,), "3"), ((), "factor=2")]:
        keywords = {"factor": 2} if not other else {}
        with pytest.raises(StateError) as raised:
            DataLoader(pipe(*other, **keywords), seed=0).load_state_dict(state)
        assert (
            f"block #1 Mapper: saved fn=functools.partial(scale, 2), "
            f"now functools.partial(scale, {shown})" in str(raised.value)
        )
    DataLoader(pipe(2), seed=0).load_state_dict(state)


def test_a_state_describing_partials_by_their_function_alone_still_loads():
    """States saved before partials listed their arguments: the function must match."""
    pipe = IterableWrapper(range(20)).map(functools.partial(scale, factor=3)).batch(4)
    state = mid_epoch_state(pipe)
    assert state["fingerprint"]["blocks"][1][1]["fn"] == "functools.partial(scale, factor=3)"
    state["fingerprint"]["blocks"][1][1]["fn"] = "partial(scale)"
    with DataLoader(pipe, seed=0) as loader:
        loader.load_state_dict(state)
        assert list(loader) == [[x * 3 for x in range(i, i + 4)] for i in (12, 16)]
    state["fingerprint"]["blocks"][1][1]["fn"] = "partial(abs)"
    with pytest.raises(StateError, match=r"saved fn=partial\(abs\), now functools.partial"):
        DataLoader(pipe, seed=0).load_state_dict(state)


def test_another_pipeline_shape_is_named():
    state = mid_epoch_state(IterableWrapper(range(20)).batch(4))
    other = DataLoader(IterableWrapper(range(20)).map(abs).batch(4), seed=0)
    with pytest.raises(StateError, match=r"pipeline of 2 blocks \(Batcher <- IterableWrapper\)"):
        other.load_state_dict(state)


def test_strict_false_loads_a_state_the_user_says_fits(tmp_path):
    for root in ("a", "b"):  # the same files under two roots
        (tmp_path / root).mkdir()
        for i in range(12):
            (tmp_path / root / f"{i:02d}.jpg").write_text(str(i))

    def build(root):
        return FileLister(str(tmp_path / root), "*.jpg").batch(4)

    state = mid_epoch_state(build("a"), steps=1)
    moved = DataLoader(build("b"), seed=0)
    with pytest.raises(StateError, match="block #1 FileLister: saved roots="):
        moved.load_state_dict(state)
    moved.load_state_dict(state, strict=False)
    assert [pathlib.Path(batch[0]).relative_to(tmp_path) for batch in moved] == [
        pathlib.Path("b/04.jpg"),
        pathlib.Path("b/08.jpg"),
    ]


def test_a_damaged_fingerprint_is_refused():
    state = mid_epoch_state(IterableWrapper(range(20)).batch(4))
    state["fingerprint"] = {"blocks": "xyz"}
    with pytest.raises(StateError, match="fingerprint is damaged"):
        DataLoader(IterableWrapper(range(20)).batch(4), seed=0).load_state_dict(state)


def test_an_old_state_without_a_fingerprint_loads_with_a_warning():
    pipe = IterableWrapper(range(20)).batch(4)
    state = mid_epoch_state(pipe, steps=2)
    old = {key: state[key] for key in ("seed", "epoch", "service")}
    old["version"] = 1  # what pipeloom saved before fingerprints
    loader = DataLoader(IterableWrapper(range(20)).batch(4), seed=0)
    with pytest.warns(UserWarning, match="state version 1.*loaded without checking"):
        loader.load_state_dict(old)
    assert [b[0] for b in loader] == [8, 12, 16]
    quiet = DataLoader(IterableWrapper(range(20)).batch(4), seed=0)
    quiet.load_state_dict(old, strict=False)  # no warning (pytest turns warnings into errors)


def test_the_check_covers_worker_services_too():
    def build(n):
        return IterableWrapper(range(n)).sharding_filter().map(abs).batch(2)

    state = mid_epoch_state(build(30), ThreadReadingService(2))
    with DataLoader(build(10), ThreadReadingService(2), seed=0) as smaller:
        with pytest.raises(StateError, match=r"saved iterable=range\(0, 30\), now range\(0, 10"):
            smaller.load_state_dict(state)


class Images(torch.utils.data.IterableDataset):
    def __len__(self):
        return 7

    def __iter__(self):
        return iter(range(7))


def scale(x, factor):
    return x * factor


def rich_pipeline():
    """Lambdas, partials, nested functions, a dataset, arrays: nothing with an address."""

    def local(x):
        return x

    pipe = IterableWrapper(np.arange(30)).map(lambda x: x + 1).map(functools.partial(scale, 2))
    pipe = pipe.map(local).filter(lambda x: x >= 0).shuffle(buffer_size=4).batch(3)
    return pipe.zip(IterableWrapper(Images())).header(5)


FINGERPRINT_SCRIPT = """
import json

from pipeloom._fingerprint import pipeline_fingerprint
from tests.test_checkpoint_fingerprint import rich_pipeline
print(json.dumps(pipeline_fingerprint(rich_pipeline())))
"""


def test_the_fingerprint_is_the_same_in_another_process_and_has_no_addresses(tmp_path):
    here = pipeline_fingerprint(rich_pipeline())
    text = json.dumps(here)
    assert "0x" not in text and " at " not in text
    assert "<lambda>" in text and "Images of 7 items" in text
    assert "functools.partial(scale, 2)" in text
    script = tmp_path / "fingerprint.py"
    script.write_text(FINGERPRINT_SCRIPT)
    root = str(pathlib.Path(__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(text)


def test_iterating_a_pipeline_does_not_change_its_fingerprint(tmp_path):
    """A pipeline iterated (or checkpointed) before the loader was built still matches."""
    for shard in range(2):
        with tarfile.open(tmp_path / f"shard-{shard}.tar", "w") as tar:
            for i in range(3):
                path = tmp_path / f"{shard}-{i}.txt"
                path.write_text(f"{shard}:{i}")
                tar.add(path, arcname=f"{shard}-{i}.txt")

    def builders():
        files = FileLister(str(tmp_path), "shard-*.tar").shuffle().sharding_filter()
        yield files.open_files("rb").load_from_tar().webdataset()
        yield rich_pipeline()
        yield SequenceWrapper(list(range(9))).shuffle().batch(2).unbatch().enumerate()
        yield IterableWrapper(range(9)).flatmap(lambda x: [x, x]).bucketbatch(2).collate()
        a, b = IterableWrapper(range(9)).fork(2)
        yield a.zip(b).cycle(2).prefetch(2).in_batch_shuffle()

    for fresh, used in zip(builders(), builders()):
        before = pipeline_fingerprint(used)
        list(DataLoader(used, seed=0))
        assert pipeline_fingerprint(used) == before == pipeline_fingerprint(fresh)
