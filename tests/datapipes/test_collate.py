"""Tests of ``collate`` (Collator) and ``default_collate``."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
import torch.utils.data
from hypothesis import given
from hypothesis import strategies as st

from pipeloom.datapipes import Collator, IterableWrapper, default_collate
from pipeloom.testing import (
    check_resume_from_every_step,
    check_same_output_everywhere,
    collect,
    collect_async,
)

Pair = collections.namedtuple("Pair", "left right")


def same(a, b):
    """Structural equality that also compares tensor dtypes."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def samples(width):
    floats = st.floats(-1e6, 1e6, allow_nan=False)
    array = st.lists(floats, min_size=width, max_size=width).map(np.array)
    tensor = st.lists(st.integers(-100, 100), min_size=width, max_size=width).map(torch.tensor)
    return st.fixed_dictionaries(
        {
            "i": st.integers(-1000, 1000),
            "f": floats,
            "b": st.booleans(),
            "s": st.text(max_size=3),
            "a": array,
            "t": tensor,
            "pair": st.builds(Pair, st.integers(0, 9), tensor),
            "list": st.tuples(floats, st.integers(0, 5)),
        }
    )


batches = st.integers(0, 3).flatmap(lambda w: st.lists(samples(w), min_size=1, max_size=5))


@given(batches)
def test_default_collate_matches_torch(batch):
    assert same(default_collate(batch), torch.utils.data.default_collate(batch))


def test_default_collate_stacks_fields():
    out = default_collate([{"x": np.zeros(2), "y": "a"}, {"x": np.ones(2), "y": "b"}])
    assert torch.equal(out["x"], torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64))
    assert out["y"] == ["a", "b"]


def test_mismatched_shapes_name_the_field_and_the_shapes():
    batch = [
        {"img": [torch.zeros(2, 3)]},
        {"img": [torch.zeros(2, 3)]},
        {"img": [torch.zeros(4, 3)]},
    ]
    with pytest.raises(
        RuntimeError,
        match=r"sample\['img'\]\[0\] has shape \(2, 3\) in entry 0 but shape \(4, 3\) in entry 2",
    ):
        default_collate(batch)


def test_mismatched_lengths_name_the_field():
    with pytest.raises(
        RuntimeError, match=r"sample\[1\] has length 2 in entry 0 but length 1 in entry 1"
    ):
        default_collate([(0, [1, 2]), (1, [3])])


def test_uncollatable_types_name_the_field():
    with pytest.raises(
        TypeError, match=r"sample\['meta'\] is a NoneType, which has no tensor form"
    ):
        default_collate([{"meta": None}, {"meta": None}])


def test_collate_applies_default_collate_to_each_batch():
    out = list(IterableWrapper([(0, 1.0), (1, 2.0), (2, 3.0)]).batch(2).collate())
    assert same(
        out,
        [
            [torch.tensor([0, 1]), torch.tensor([1.0, 2.0], dtype=torch.float64)],
            [torch.tensor([2]), torch.tensor([3.0], dtype=torch.float64)],
        ],
    )


def test_custom_collate_fn_and_repr_and_len():
    dp = IterableWrapper(range(5)).batch(2).collate(sum)
    assert list(dp) == [1, 5, 4] and len(dp) == 3
    assert repr(dp) == "Collator(collate_fn=sum)"
    assert repr(IterableWrapper([]).collate()) == "Collator(collate_fn=default_collate)"
    assert type(dp) is Collator


def test_non_callable_collate_fn_is_a_type_error():
    with pytest.raises(TypeError, match="expects collate_fn to be a callable"):
        IterableWrapper([]).collate(collate_fn=1)


def test_collate_errors_are_noted_with_the_block():
    with pytest.raises(RuntimeError) as info:
        list(IterableWrapper([[torch.zeros(1), torch.zeros(2)]]).collate())
    assert any("Collator(collate_fn=default_collate)" in n for n in info.value.__notes__)


def test_resume_and_async_agree():
    def make():
        return IterableWrapper(range(7)).batch(3).collate()

    assert same(collect(make()), collect_async(make()))
    check_resume_from_every_step(lambda: IterableWrapper(range(7)).batch(3).collate(tuple))


number_batches = st.lists(
    st.one_of(
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False),
        st.booleans(),
    ),
    min_size=1,
    max_size=20,
)


@given(batch=number_batches)
def test_batches_of_python_numbers_collate_exactly_as_torch_does(batch):
    try:
        expected = torch.utils.data.default_collate(batch)
    except Exception as error:  # noqa: BLE001 - then we must fail the same way
        with pytest.raises(type(error)):
            default_collate(batch)
        return
    got = default_collate(batch)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got, expected)


def sample(x):
    return {"x": torch.full((2,), float(x)), "label": x % 3}


@pytest.mark.timeout(120)
def test_same_collated_batches_under_every_service():
    ran = check_same_output_everywhere(
        lambda: IterableWrapper(range(10)).sharding_filter().map(sample).batch(4).collate(),
        epochs=2,
    )
    assert ran == ["in-process", "threads", "classic", "economic", "chunked"]


# -- torchdata 0.9's arguments --------------------------------------------------------


def test_collate_takes_torchdatas_conversion_and_collate_fn():
    batches = IterableWrapper([[1, 2], [3]])
    assert collect(batches.collate(sum)) == [3, 3]  # conversion, positionally
    assert collect(batches.collate(conversion=len)) == [2, 1]
    assert collect(batches.collate(conversion=len, collate_fn=sum)) == [3, 3]  # collate_fn wins
    default = collect(batches.collate(conversion=torch.utils.data.default_collate))
    assert [t.tolist() for t in default] == [[1, 2], [3]]
    with pytest.raises(TypeError, match=r"TorchArrow DataFrames.*collate_fn="):
        batches.collate(conversion={"a": torch.tensor})


# -- big batches reuse the memory of dropped ones (pipeloom/datapipes/_warm.py) ----------


def test_big_batches_reuse_dropped_memory_and_never_a_live_batch():
    import numpy as np

    from pipeloom.datapipes import IterableWrapper

    rows = [torch.full((64, 1024), float(i)) for i in range(32)]  # 256 KiB rows, 2 MiB batches
    pipe = IterableWrapper(rows).batch(8).collate()
    kept = []
    for i, batch in enumerate(pipe):
        assert torch.equal(batch, torch.utils.data.default_collate(rows[8 * i : 8 * i + 8]))
        if i % 2 == 0:
            kept.append((batch, batch.clone()))  # held by the consumer: must not change
        for held, copy in kept:
            assert torch.equal(held, copy)
    warm = pipe._warm  # noqa: SLF001 - the pool the collator used
    assert warm.reused >= 1  # batches 1 and 3 were dropped: their memory came back
    assert warm.held_bytes == 0  # the epoch ended: nothing kept at rest
    arrays = [np.full((512, 512), i, dtype=np.float32) for i in range(4)]  # NumPy samples too
    (stacked,) = list(IterableWrapper(arrays).batch(4).collate())
    assert torch.equal(stacked, torch.utils.data.default_collate(arrays))


def test_views_of_a_dropped_big_batch_keep_its_memory_from_reuse():
    """The batch object goes, a view of it stays: its memory must not take the next batch."""
    from pipeloom.datapipes import IterableWrapper

    def views(batch):
        return [batch[1], batch.numpy(), batch.view(-1)[5:], batch.untyped_storage()]

    def content(view):
        return bytes(view[:64]) if isinstance(view, torch.UntypedStorage) else view.tolist()

    rows = [torch.full((64, 1024), float(i)) for i in range(48)]  # 2 MiB batches of 8
    pipe = IterableWrapper(rows).batch(8).collate()
    held = []
    for i, batch in enumerate(pipe):
        view = views(batch)[i % 4]
        held.append((view, content(view)))
        del batch, view  # only the view keeps the memory now
        assert all(content(kept) == before for kept, before in held)
    assert pipe._warm.reused == 0  # noqa: SLF001 - every batch's memory stayed in use


def test_a_collator_copies_and_pickles_without_its_buffers():
    import copy
    import pickle

    from pipeloom.datapipes import IterableWrapper

    pipe = IterableWrapper([torch.ones(512, 512)] * 4).batch(2).collate()
    first = next(iter(pipe))
    assert "_warm" in vars(pipe)
    for twin in (copy.deepcopy(pipe), pickle.loads(pickle.dumps(pipe))):
        assert "_warm" not in vars(twin)
        assert torch.equal(next(iter(twin)), first)
