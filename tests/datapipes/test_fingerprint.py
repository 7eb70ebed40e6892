"""The fingerprint of an upstream graph: sees what changes outputs, ignores what does not."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch

from pipeloom import DataLoader
from pipeloom.datapipes import (
    FileLister,
    IterableWrapper,
    IterDataPipe,
    UnfingerprintableError,
    fingerprint,
    item_rng,
)
from pipeloom.datapipes._fingerprint import random_blocks
from pipeloom.reading_service import InProcessReadingService

SCALE = 3


def scaled(x):
    return x * SCALE


def digest(pipe):
    return fingerprint(pipe).digest


def test_the_same_pipeline_built_twice_has_the_same_fingerprint():
    assert digest(IterableWrapper(range(4)).map(scaled).batch(2)) == digest(
        IterableWrapper(range(4)).map(scaled).batch(2)
    )


def test_arguments_and_structure_change_it():
    base = digest(IterableWrapper(range(4)).map(scaled).batch(2))
    assert digest(IterableWrapper(range(5)).map(scaled).batch(2)) != base
    assert digest(IterableWrapper(range(4)).map(scaled).batch(3)) != base
    assert digest(IterableWrapper(range(4)).batch(2).map(scaled)) != base


def test_lambdas_count_by_code_and_constants_not_by_line():
    first = lambda x: x + 1  # noqa: E731
    same = lambda x: x + 1  # noqa: E731
    other = lambda x: x + 2  # noqa: E731
    assert digest(IterableWrapper([1]).map(first)) == digest(IterableWrapper([1]).map(same))
    assert digest(IterableWrapper([1]).map(first)) != digest(IterableWrapper([1]).map(other))


def test_closure_values_defaults_and_partial_arguments_count():
    def make(k):
        return lambda x: x * k

    assert digest(IterableWrapper([1]).map(make(2))) != digest(IterableWrapper([1]).map(make(3)))

    def add(x, k=1):
        return x + k

    assert digest(IterableWrapper([1]).map(functools.partial(add, k=1))) != digest(
        IterableWrapper([1]).map(functools.partial(add, k=2))
    )


def test_module_globals_a_function_reads_count(monkeypatch):
    before = digest(IterableWrapper([1]).map(scaled))
    monkeypatch.setattr(f"{__name__}.SCALE", 4)
    assert digest(IterableWrapper([1]).map(scaled)) != before


class Affine:
    def __init__(self, a):
        self.a = a

    def __call__(self, x):
        return self.a * x


def test_callable_objects_count_by_attributes():
    assert digest(IterableWrapper([1]).map(Affine(2))) == digest(
        IterableWrapper([1]).map(Affine(2))
    )
    assert digest(IterableWrapper([1]).map(Affine(2))) != digest(
        IterableWrapper([1]).map(Affine(3))
    )


def test_arrays_and_tensors_count_by_contents():
    def pipe(value):
        return IterableWrapper([1]).map(functools.partial(np.add, value))

    assert digest(pipe(np.zeros(3))) == digest(pipe(np.zeros(3)))
    assert digest(pipe(np.zeros(3))) != digest(pipe(np.ones(3)))
    assert digest(IterableWrapper([torch.zeros(2)])) != digest(IterableWrapper([torch.ones(2)]))


def test_a_listed_file_that_changes_changes_it(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"1")
    before = digest(IterableWrapper([str(path)]).map(len))
    path.write_bytes(b"12")
    assert digest(IterableWrapper([str(path)]).map(len)) != before
    lister = digest(FileLister(str(tmp_path)))
    (tmp_path / "b.bin").write_bytes(b"")
    assert digest(FileLister(str(tmp_path))) != lister


def test_iteration_state_and_sharding_settings_do_not_change_it(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"1")
    pipe = FileLister(str(tmp_path)).sharding_filter().map(os.path.basename)
    before = digest(pipe)
    assert list(pipe) == ["a.bin"]
    pipe.source.sharding_settings(2, 1)
    assert digest(pipe) == before


def augment(x):
    return x + float(item_rng().random())


def test_a_function_calling_pipeloom_keeps_its_fingerprint_after_a_run():
    # item_rng's module state (the current item's stamp) went into the digest of every
    # function calling it: a pipeline built after another had run got a new fingerprint,
    # so a snapshot(allow_random=True) over it was written again (another epoch frozen)
    def build():
        return IterableWrapper(range(4)).map(augment)

    before = digest(build())
    with DataLoader(build(), reading_service=InProcessReadingService(), seed=1) as loader:
        assert len(list(loader)) == 4
    assert digest(build()) == before


class Opaque:
    __slots__ = ()


class Log(list):
    def __pipeloom_fingerprint__(self):
        return "a log"


def test_values_without_identity_raise_and_may_speak_for_themselves():
    thing = Opaque()
    with pytest.raises(UnfingerprintableError, match=r"block #0 Mapper.*Opaque.*pass key="):
        fingerprint(IterableWrapper([1]).map(lambda x: (thing, x)))
    log = Log()
    pipe = IterableWrapper([1]).map(lambda x: log.append(x) or x)
    before = digest(pipe)
    log.append(5)
    assert digest(pipe) == before


def test_a_key_replaces_the_graph():
    assert fingerprint(IterableWrapper([1]), key="v1") == fingerprint(
        IterableWrapper([2]), key="v1"
    )
    with pytest.raises(TypeError, match="key must be a non-empty str"):
        fingerprint(IterableWrapper([1]), key="")


class Sampler(IterDataPipe):
    inputs = ("source",)

    def __init__(self, source, seed=None):
        self.source, self.seed = source, seed

    def __iter__(self):
        return iter(self.source)


class Declared(IterDataPipe):
    inputs = ("source",)
    randomized = True

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        return iter(self.source)


def test_random_blocks_are_the_shuffles_seeded_blocks_and_declared_ones():
    pipe = Declared(Sampler(IterableWrapper(range(3)).shuffle().map(scaled)))
    assert [type(b).__name__ for b in random_blocks(pipe)] == ["Declared", "Sampler", "Shuffler"]
    assert random_blocks(IterableWrapper(range(3)).map(scaled).batch(2)) == []
    assert [type(b).__name__ for b in random_blocks(IterableWrapper([1]).cycle(2))] == ["Cycler"]
