"""Attacks from the outside on the language-model blocks (mix, pack, bucket, pad) and their resume.

Each test is a promise of ``docs/language_models.md`` checked on odd input:
every token of every document comes out the documented number of times under
each stop policy (empty documents, documents longer than a row, a weight of
0, a source that runs out mid-epoch); a state saved at any step resumes the
rest of the epoch exactly, also on other services and worker counts; and bad
input (items of different keys, a misspelt ``pad_value`` key, weights in a
dict) is refused with a message that says what to do instead of giving rows
with a field dropped or padded with a real token id.
"""

from __future__ import annotations

import collections
import copy
import itertools
import pickle
import random
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom import DataLoader, item_rng
from pipeloom.datapipes import IterableWrapper, IterDataPipe, PadCollate
from pipeloom.errors import StateError
from pipeloom.reading_service import (
    InProcessReadingService,
    MultiProcessingReadingService,
    ThreadReadingService,
)
from pipeloom.testing import check_resume_from_every_step, collect
from tests.datapipes.sequences import plain
from tests.reading_service.test_elastic import _elastic

_WEIGHTS = st.sampled_from([0, 1, 2, 3, 0.5, 0.25])
_STOPS = st.sampled_from(["first", "all", "cycle"])
# Lengths that hit the edges for rows of 4: empty, one, exactly a row, over one and two rows.
_LENGTHS = st.lists(st.sampled_from([0, 1, 3, 4, 5, 9]), max_size=6)


def _documents(source: int, lengths: list[int]) -> list[list[int]]:
    """Documents whose tokens say where they come from: source, document, token (all > 0)."""
    return [[source * 10_000 + d * 100 + t + 1 for t in range(n)] for d, n in enumerate(lengths)]


def _tail(name: str, pipe: IterDataPipe) -> IterDataPipe:
    if name == "pack":
        return pipe.pack(4, buffer_size=2)
    if name == "pack first_fit":
        return pipe.pack(4, "first_fit", buffer_size=3)
    if name == "concat_then_split":
        return pipe.concat_then_split(4)
    return pipe.bucket_by_length(len, boundaries=[3], batch_sizes=2, buffer_size=3)


def _tokens(outputs: list[Any]) -> list[int]:
    """The document tokens in rows (padding is 0) or in batches of documents."""
    found: list[int] = []
    for output in outputs:
        if isinstance(output, tuple):
            found += [t for t in output[0].tolist() if t]
        elif output and isinstance(output[0], list):
            found += [t for document in output for t in document]
        else:
            found += output
    return found


def _mix(spec, stop: str, sampling: str, tail: str) -> Callable[[], IterDataPipe]:
    """The mix of the sources in ``spec``, then ``tail``; with ``"names"``, the mix of
    ``(source, document)`` names instead (the same choices: they depend on the counts and
    the mix's own seed only)."""

    def build() -> IterDataPipe:
        sources = [
            IterableWrapper(
                [(s, d) for d in range(len(lengths))] if tail == "names" else _documents(s, lengths)
            )
            for s, (lengths, _) in enumerate(spec)
        ]
        mixed = sources[0].mux(
            *sources[1:], weights=[w for _, w in spec], stop=stop, sampling=sampling, seed=5
        )  # its own seed: the same draws whatever follows it
        return mixed if tail == "names" else _tail(tail, mixed)

    return build


def _expected_counts(spec, stop: str, taken: dict[int, int]) -> collections.Counter:
    """Each token's count, given how many documents each source gave (``taken``)."""
    counts: collections.Counter = collections.Counter()
    for s, (lengths, weight) in enumerate(spec):
        documents = _documents(s, lengths)
        if not weight:
            assert taken[s] == 0, f"source {s} has weight 0 but gave {taken[s]} documents"
            continue
        if stop == "all":
            assert taken[s] == len(documents), (s, taken[s])
        elif stop == "cycle":
            assert taken[s] >= len(documents), f"source {s} was not read through once"
        for k in range(taken[s]):
            counts.update(documents[k % len(documents)])
    return counts


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(_LENGTHS, _WEIGHTS), min_size=1, max_size=3),
    _STOPS,
    st.sampled_from(["smooth", "random"]),
    st.sampled_from(["pack", "pack first_fit", "concat_then_split", "bucket_by_length"]),
)
def test_every_token_of_every_mixed_document_comes_out_the_documented_number_of_times(
    spec, stop, sampling, tail
):
    if not any(weight for _, weight in spec):
        return
    names = collect(_mix(spec, stop, sampling, "names")(), epoch=1)
    taken = {s: sum(1 for source, _ in names if source == s) for s in range(len(spec))}
    # The mix passes each source's documents in order, round after round.
    for s, (lengths, _) in enumerate(spec):
        mine = [d for source, d in names if source == s]
        assert mine == [k % len(lengths) for k in range(len(mine))]
    expected = _expected_counts(spec, stop, taken)
    rows = collect(_mix(spec, stop, sampling, tail)(), epoch=1)
    assert collections.Counter(_tokens(rows)) == expected
    for row in rows:
        if isinstance(row, tuple) and tail.startswith("pack"):
            values, segments, positions = (x.tolist() for x in row)
            for segment in set(segments) - {0}:  # a segment is one run of one document
                piece = [v for v, g in zip(values, segments) if g == segment]
                assert len({v // 100 for v in piece}) == 1, row
                assert [p for p, g in zip(positions, segments) if g == segment] == list(
                    range(len(piece))
                )
                whole = len(piece) == piece[-1] % 100 - piece[0] % 100 + 1
                assert whole, row  # a run of consecutive tokens: nothing skipped


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(_LENGTHS, _WEIGHTS), min_size=2, max_size=3),
    _STOPS,
    st.sampled_from(["smooth", "random"]),
    st.sampled_from(["pack", "concat_then_split", "bucket_by_length"]),
)
def test_a_mix_packed_or_bucketed_resumes_exactly_from_every_step(spec, stop, sampling, tail):
    if not any(weight for _, weight in spec):
        return
    check_resume_from_every_step(_mix(spec, stop, sampling, tail), seed=3, epoch=1)


def _keep(x: Any) -> Any:
    return x


def _service_pipeline(tail: str) -> IterDataPipe:
    rng = random.Random(tail)
    lengths = [rng.choice([0, 1, 3, 4, 5, 9]) for _ in range(14)]
    sharded = IterableWrapper(_documents(1, lengths)).shuffle().sharding_filter().map(_keep)
    books = IterableWrapper(_documents(2, [2, 9, 0, 4])).shuffle()  # restarted by the cycle
    return _tail(tail, sharded.mux(books, weights=[2, 1], stop="cycle"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tail", ["pack", "concat_then_split"])
def test_a_cycled_mix_after_the_workers_resumes_on_another_service_and_worker_count(tail):
    """Threads <-> processes with another worker count, in-process <-> processes."""
    services = [
        lambda: ThreadReadingService(2),
        lambda: MultiProcessingReadingService(3, start_method="fork", timeout=20),
        InProcessReadingService,  # its states load into worker services and back
    ]
    with DataLoader(_service_pipeline(tail), seed=4) as loader:
        epoch, following = plain(list(loader)), plain(list(loader))
    for save, load, step in [(0, 1, 3), (1, 0, 5), (2, 1, 4), (1, 2, 2)]:
        with DataLoader(_service_pipeline(tail), services[save](), seed=4) as loader:
            outputs = iter(loader)
            head = [plain(next(outputs)) for _ in range(step)]
            state = pickle.loads(pickle.dumps(loader.state_dict()))
        with DataLoader(_service_pipeline(tail), services[load](), seed=9) as resumed:
            resumed.load_state_dict(state)
            assert head + plain(list(resumed)) == epoch, (save, load, step)
            assert plain(list(resumed)) == following


# -- a resume on fewer ranks: the bins of several ranks ------------------------------


def test_pack_holding_several_ranks_bins_passes_the_extra_on_before_reading_more():
    held = []
    for token in (1, 7):  # two old ranks, each holding two open bins of 3 tokens
        rank = IterableWrapper([[token] * 3, [token + 1] * 3, [99] * 4]).pack(4, buffer_size=2)
        next(iter(rank))  # the full row of 99s comes out; the two bins stay open
        held.append(rank.state_dict())
    merged = IterableWrapper([[20 + i] * 3 for i in range(4)]).pack(4, buffer_size=2)
    rows = iter(merged)
    merged.load_held_states(held)
    out = []
    for values, _, _ in rows:
        out.append(values.tolist())
        assert len(merged.state_dict()["bins"]) <= 2, out  # buffer_size bins, not four
    assert sorted(out) == sorted([[t] * 3 + [0] for t in (1, 2, 7, 8, 20, 21, 22, 23)])
    assert out[:2] == [[1, 1, 1, 0], [2, 2, 2, 0]]  # the fullest, the earliest first


# -- bad input: refused, not dropped or padded with a real token -------------------


_ROW_BLOCKS = {
    "pack": lambda items, **kw: IterableWrapper(items).pack(8, **kw),
    "concat_then_split": lambda items, **kw: IterableWrapper(items).concat_then_split(8, **kw),
    "padded_batch": lambda items, **kw: IterableWrapper(items).padded_batch(2, **kw),
}


@pytest.mark.parametrize("block", sorted(_ROW_BLOCKS))
def test_a_field_only_a_later_item_has_is_refused_not_dropped(block):
    items = [{"input_ids": [1, 2]}, {"input_ids": [3], "labels": [-100]}]
    with pytest.raises(ValueError, match=r"another item has key 'labels', the first lacks it"):
        collect(_ROW_BLOCKS[block](items))
    items = [{"input_ids": [1, 2], "labels": [2, -100]}, {"input_ids": [3]}]
    with pytest.raises(ValueError, match=r"first has key 'labels', another item lacks it"):
        collect(_ROW_BLOCKS[block](items))
    with pytest.raises(TypeError, match=r"mixing dicts and plain sequences.*one form"):
        collect(_ROW_BLOCKS[block]([[1, 2], {"input_ids": [3]}]))


@pytest.mark.parametrize("block", sorted(_ROW_BLOCKS))
def test_a_pad_value_for_a_field_the_items_lack_is_refused_not_padded_with_zero(block):
    items = [{"input_ids": [1, 2], "labels": [2, -100]}, {"input_ids": [3], "labels": [-100]}]
    with pytest.raises(ValueError, match=r"pad_value for \['label'\].*fields are \['input_ids'"):
        collect(_ROW_BLOCKS[block](items, pad_value={"label": -100}))
    with pytest.raises(ValueError, match=r"items are plain sequences .* pass one number"):
        collect(_ROW_BLOCKS[block]([[1, 2], [3]], pad_value={"labels": -100}))


def test_an_empty_list_leaves_int_tokens_int_when_padded():
    (batch,) = collect(IterableWrapper([{"input_ids": []}, {"input_ids": [7]}]).padded_batch(2))
    assert batch["input_ids"].dtype == torch.int64
    assert batch["input_ids"].tolist() == [[0], [7]]
    assert PadCollate()([[], [5, 6]]).values.dtype == torch.int64


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ({"web": 2, "code": 1}, r"sequence of numbers, one per source .* got dict"),
        (torch.tensor([2.0, 1.0]), r"got Tensor .* \.tolist\(\)"),
    ],
)
def test_weights_in_a_dict_or_a_tensor_say_how_to_pass_them(weights, match):
    with pytest.raises(TypeError, match=match):
        IterableWrapper([1]).mux(IterableWrapper([2]), weights=weights)


# -- per-row randomness: the rows cut from one long document ---------------------------


def _with_draw(row: Any) -> tuple[list[int], float]:
    return row[0].tolist(), float(item_rng().random())


_CUTTERS = {
    "pack": lambda: IterableWrapper([list(range(1, 15)), [20, 21]]).sharding_filter().pack(4),
    "concat_then_split": lambda: (
        IterableWrapper([list(range(1, 15)), [20, 21]]).sharding_filter().concat_then_split(4)
    ),
}


@pytest.mark.parametrize("block", sorted(_CUTTERS))
def test_rows_cut_from_one_document_draw_their_own_item_rng_numbers(block):
    rows = collect(_CUTTERS[block]().map(_with_draw))
    assert [values[0] for values, _ in rows] == [1, 5, 9, 13]
    draws = [draw for _, draw in rows]
    assert len(set(draws)) == len(draws), rows  # each row is an output of its own
    check_resume_from_every_step(lambda: _CUTTERS[block]().map(_with_draw))


# -- resuming with other weights through the loader, as the doc shows ---------------------


def _web_and_code(weights: list[int] | None) -> IterDataPipe:
    web, code = IterableWrapper(["web"] * 50), IterableWrapper(["code"] * 50)
    return web.mux(code, weights=weights)


def test_the_loader_resumes_a_mix_with_new_weights_and_refuses_a_change_of_kind():
    with DataLoader(_web_and_code([1, 1]), seed=0) as loader:
        outputs = iter(loader)
        assert [next(outputs) for _ in range(6)] == ["web", "code"] * 3
        state = loader.state_dict()
    with DataLoader(_web_and_code([3, 1]), seed=0) as resumed:  # more web from now on
        resumed.load_state_dict(state)
        assert list(itertools.islice(resumed, 4)) == ["web", "web", "code", "web"]
    with DataLoader(_web_and_code(None), seed=0) as rounds:  # torchdata's rounds: no counts
        rounds.load_state_dict(state)  # blocks take their states when the epoch starts
        with pytest.raises(StateError, match=r"weighted mux state .* build it with weights"):
            next(iter(rounds))
    with DataLoader(_web_and_code([3, 1]), seed=0) as other:  # another change: still refused
        state["fingerprint"]["blocks"][1][1]["iterable"] = "list of 9 items"
        with pytest.raises(StateError, match=r"IterableWrapper: saved iterable=list of 9 items"):
            other.load_state_dict(state)


# -- rows after the sharding point, resumed on another number of ranks ---------------------


def _rows_after_the_point(block: str, lengths: list[int]) -> Callable[[], IterDataPipe]:
    def build() -> IterDataPipe:
        sharded = IterableWrapper(_documents(1, lengths)).sharding_filter()
        if block == "concat_then_split":
            return sharded.concat_then_split(4)
        return sharded.pack(4, buffer_size=2)

    return build


@pytest.mark.timeout(60)
@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    st.sampled_from(["concat_then_split", "pack"]),
    st.lists(st.sampled_from([0, 1, 3, 4, 5, 9]), min_size=1, max_size=14),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(0, 5),
)
def test_rows_after_the_sharding_point_resume_on_another_number_of_ranks(
    block, lengths, old, new, step
):
    build = _rows_after_the_point(block, lengths)
    head, tail = _elastic("in-process", build, old, new, step)
    rows = head + [row for outputs in tail for row in outputs]
    assert sorted(_tokens(rows)) == sorted(t for d in _documents(1, lengths) for t in d)


@pytest.mark.parametrize("block", sorted(_ROW_BLOCKS))
@pytest.mark.parametrize(
    ("items", "error", "match"),
    [
        (
            [["the", "cat"], ["sat"]],
            TypeError,
            r"needs the sequence entries to hold numbers .* tokenize",
        ),
        (
            [{"input_ids": [1], "src": [5]}, {"input_ids": [2], "src": "books"}],
            TypeError,
            r"'src' entr(y|ies) .*str 'books'",
        ),
        ([np.zeros((2, 3)), np.zeros((1, 4))], ValueError, r"entries differ after it: shapes"),
    ],
)
def test_entries_torch_cannot_lay_out_say_which_and_what_to_do(block, items, error, match):
    with pytest.raises(error, match=match):
        collect(_ROW_BLOCKS[block](items))


# -- damaged states: refused, not resumed at the wrong place ---------------------------

# Fields of the user's items (any value is valid) and stamps: corrupted whole.
_WHOLE = {
    "bins", "ready", "stamps", "contexts", "sample", "buckets", "filling", "pending", "batch",
}  # fmt: skip


def _lm_blocks() -> IterDataPipe:
    docs = IterableWrapper(_documents(1, [3, 1, 9, 4, 0, 5, 2, 7, 3, 6]))
    code = IterableWrapper(_documents(2, [2, 5, 1, 4]))
    mixed = docs.mux(code, weights=[2, 1], stop="all")
    rows = mixed.pack(4, buffer_size=2).map(_values_of)
    more = IterableWrapper(_documents(3, [5, 2, 7])).concat_then_split(3).map(_values_of)
    return rows.concat(more).bucket_by_length(len, boundaries=[3], batch_sizes=2, buffer_size=3)


def _values_of(row: Any) -> list[int]:
    return [t for t in row[0].tolist() if t]


def _paths(value: Any, path: tuple = ()):
    if path:
        yield path
    if path and path[-1] in _WHOLE:
        return
    if isinstance(value, (dict, list)):
        for key, inner in value.items() if isinstance(value, dict) else enumerate(value):
            yield from _paths(inner, (*path, key))


def _damaged(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return ["xyz", 1, None]
    if isinstance(value, int):
        return [3.5, True, None, -1, 10_000]
    return ["xyz", 3.5, {"a": 1}, None, [[1], [2, 3]]]


def _token_budget() -> IterDataPipe:
    lengths = [3, 1, 9, 4, 2, 5, 2, 7, 3, 6, 1, 1, 2]
    return IterableWrapper(_documents(1, lengths)).max_token_bucketize(
        10, buffer_size=4, include_padding=True
    )


@pytest.mark.parametrize("build", [_lm_blocks, _token_budget])
def test_a_damaged_state_of_the_lm_blocks_is_refused_or_resumes_exactly(build):
    with DataLoader(build(), seed=0) as loader:
        epoch = list(loader)
        loader.set_epoch(0)
        outputs = iter(loader)
        head = [next(outputs) for _ in range(len(epoch) // 2)]
        state = loader.state_dict()
    blocks = state["service"]["pipeline"]["blocks"]
    wrong = []
    for index, block in enumerate(blocks):
        for path in _paths(block["state"]):
            parent = block["state"]
            for key in path[:-1]:
                parent = parent[key]
            if isinstance(parent, tuple):
                continue
            for bad in _damaged(parent[path[-1]]):
                damaged = copy.deepcopy(state)
                target = damaged["service"]["pipeline"]["blocks"][index]["state"]
                for key in path[:-1]:
                    target = target[key]
                target[path[-1]] = bad
                with DataLoader(build(), seed=0) as resumed:
                    try:
                        resumed.load_state_dict(damaged)
                        rest = list(resumed)
                    except StateError:
                        continue
                if head + rest != epoch:
                    wrong.append((block["type"], path, bad))
    assert not wrong, f"resumed silently wrong after damaging: {wrong}"


# -- ranks: a corpus mixed in after the sharding point is read whole by every rank ---------


def _initialized(pipeline: IterDataPipe, ranks: int) -> None:
    from tests.reading_service.thread_ranks import World, rank_service

    service = rank_service(World(ranks, 5.0), 0)
    try:
        service.initialize(pipeline)
    finally:
        service.shutdown()


def test_a_corpus_mixed_in_after_the_sharding_point_warns_that_every_rank_reads_it_whole():
    def web() -> IterDataPipe:
        return IterableWrapper(_documents(1, [2] * 8))

    code = IterableWrapper(_documents(2, [3] * 4))
    after = web().sharding_filter().mux(code, weights=[2, 1], stop="all")
    with pytest.warns(
        UserWarning,
        match=r"IterableWrapper.* joins the stream after the sharding"
        r" point, so each of the 3 ranks reads all of it.* before sharding_filter",
    ):
        _initialized(after, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _initialized(after, 1)  # alone: nothing is read twice
        _initialized(web().mux(code, weights=[2, 1], stop="all").sharding_filter(), 3)


def test_a_source_marked_read_by_every_rank_is_not_warned_about():
    def sharded() -> IterDataPipe:
        return IterableWrapper(_documents(1, [2] * 8)).sharding_filter()

    constant = IterableWrapper([0] * 8)
    constant.read_by_every_rank = True  # a side input every rank should read whole
    ids = IterableWrapper(range(8))
    side = ids.map(str)
    side.read_by_every_rank = True  # on a block of the side branch: covers its source
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _initialized(sharded().zip(constant), 3)
        _initialized(sharded().zip(side), 3)
    code = IterableWrapper(_documents(2, [3] * 4))
    with pytest.warns(UserWarning, match=r"joins the stream after the sharding") as caught:
        _initialized(sharded().zip(constant, code), 3)  # the unmarked one still warns
        joined = sharded().zip(code)
        joined.read_by_every_rank = True  # after the join: not a side branch, no silence
        _initialized(joined, 3)
    assert [str(w.message).split(" joins")[0] for w in caught] == [repr(code)] * 2
