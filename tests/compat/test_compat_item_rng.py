"""``pipeloom.item_rng()`` in a compat dataset follows torch's seeding rule and resumes exactly.

Each ``iter()`` draws torch's base seed (from ``generator``, or torch's
global RNG), and the engine runs the epoch's plan under it. Before, every
compat loader ran the same seed: two runs seeded differently drew the same
"random" values, and a resumed epoch drew the values of the epoch's first
batches again (the rest of the epoch was numbered from 0).
"""

from __future__ import annotations

import random

import pytest
import torch

from pipeloom import item_rng
from pipeloom.compat import DataLoader


class Draws(torch.utils.data.Dataset):
    """Item ``i`` with one draw of ``item_rng()`` and one of Python's ``random``."""

    def __init__(self, n: int = 12, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.fail_at:
            self.fail_at = None  # once (in this process)
            raise ValueError(f"bad sample {i}")
        return torch.tensor([i, int(item_rng().integers(1 << 30)), random.randrange(1 << 30)])


def build(dataset=None, **kwargs) -> DataLoader:
    if kwargs.get("num_workers"):
        kwargs["timeout"] = 30  # a hang fails fast
    return DataLoader(dataset or Draws(), batch_size=3, shuffle=True, **kwargs)


def epoch(loader) -> list:
    return [batch.tolist() for batch in loader]


def item_draws(batches: list) -> list:
    return [[row[:2] for row in batch] for batch in batches]


def test_two_loaders_without_a_seed_draw_different_values_and_torch_manual_seed_repeats():
    def in_order() -> list:  # the same indices at the same positions in both
        return epoch(DataLoader(Draws(), batch_size=3))

    assert item_draws(in_order()) != item_draws(in_order())
    torch.manual_seed(3)
    again = epoch(build())
    torch.manual_seed(3)
    assert item_draws(epoch(build())) == item_draws(again)


def test_a_generator_fixes_the_draws_whatever_the_global_seed():
    torch.manual_seed(1)
    a = epoch(build(generator=torch.Generator().manual_seed(5)))
    torch.manual_seed(2)
    b = epoch(build(generator=torch.Generator().manual_seed(5)))
    assert item_draws(a) == item_draws(b)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "workers",
    [
        {},
        {"num_workers": 2},
        {"num_workers": 2, "persistent_workers": True},
        {"num_workers": 2, "strategy": "economic"},
    ],
    ids=["in-process", "classic", "persistent", "economic"],
)
def test_a_fresh_loader_resumes_the_second_epoch_with_its_own_draws(workers):
    torch.manual_seed(0)
    whole = build(**workers)
    epoch(whole)
    expected = item_draws(epoch(whole))
    after = item_draws(epoch(whole))
    torch.manual_seed(0)
    saved = build(**workers)
    epoch(saved)
    it = iter(saved)
    head = [next(it).tolist() for _ in range(2)]
    state = saved.state_dict()
    resumed = build(**workers)
    resumed.load_state_dict(state)
    it = iter(resumed)
    middle = [next(it).tolist()]
    again = build(**workers)  # a resume of the resumed epoch
    again.load_state_dict(resumed.state_dict())
    assert item_draws(head + middle + epoch(again)) == expected
    assert item_draws(epoch(again)) == after  # the epochs after it are the uninterrupted ones


def test_economic_seeds_the_global_rngs_from_torch_s_base_seed():
    def run() -> list:
        return [[row[2] for row in b] for b in epoch(build(num_workers=2, strategy="economic"))]

    assert run() != run()
    torch.manual_seed(4)
    a = run()
    torch.manual_seed(4)
    assert run() == a


def test_the_batches_after_a_failed_one_draw_what_the_uninterrupted_epoch_drew():
    torch.manual_seed(0)
    expected = item_draws(epoch(build()))
    torch.manual_seed(0)
    it = iter(build(Draws(fail_at=expected[1][0][0])))
    got = [next(it).tolist()]
    with pytest.raises(ValueError, match="bad sample"):
        next(it)
    got += list(batch.tolist() for batch in it)
    assert item_draws(got) == expected[:1] + expected[2:]


def test_a_state_saved_before_the_plan_kept_its_place_still_loads():
    torch.manual_seed(0)
    loader = build()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del state["epochs"]
    for key in ("first", "first_index", "plan_epoch"):
        del state["epoch"][key]
    old = build()
    old.load_state_dict(state)
    assert len(epoch(old)) == 3


class IterDraws(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(6):
            yield (i, int(item_rng().integers(1 << 30)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterable_dataset_can_draw_from_item_rng_in_its_iter(workers):
    def run() -> list:
        loader = DataLoader(IterDraws(), batch_size=None, num_workers=workers)
        return [tuple(map(int, x)) for x in loader]

    torch.manual_seed(2)
    first = run()
    torch.manual_seed(2)
    assert run() == first  # each worker reads the whole dataset, as torch's do
    assert len({draw for _, draw in first}) == len(first)  # one key per output
