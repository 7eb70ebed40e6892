"""FullSync (fullsync): every rank ends the epoch at the same step.

The ranks run on 127.0.0.1 (gloo), forked from one spawned launcher
(``distributed_ranks.fork_ranks``); each scenario's
result comes back through a pickle file. Every rank exits after a deadline,
so a hang fails the test instead of blocking it.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import pickle
import socket

import pytest
import torch.distributed as dist

from pipeloom import DataLoader
from pipeloom.datapipes import FullSync, IterableWrapper, RankStopped
from pipeloom.testing import check_resume_from_every_step
from tests.datapipes.everywhere import check_same_output_everywhere
from tests.reading_service.distributed_ranks import fork_ranks

WORLD = 2


def by_hand(rank):
    """torchdata's documented case: 23 items, sharded by hand, 12 and 11 per rank."""
    pipe = IterableWrapper(range(23)).sharding_filter()
    pipe.sharding_settings(WORLD, rank)
    return list(pipe.fullsync(timeout=20))


def with_service(rank):
    from pipeloom.reading_service import DistributedReadingService

    pipe = IterableWrapper(range(23)).sharding_filter().batch(2).fullsync(timeout=20)
    service = DistributedReadingService(end_check="step", timeout=20)
    with DataLoader(pipe, service, seed=0) as loader:
        return [list(loader), list(loader)]


def explode_on_rank_one(x):
    if x == 5:
        raise KeyError("bad sample on rank 1")
    return x


def one_rank_fails(rank):
    pipe = IterableWrapper(range(20)).sharding_filter()
    pipe.sharding_settings(WORLD, rank)
    try:
        return list(pipe.map(explode_on_rank_one).fullsync(timeout=20))
    except KeyError as error:
        return type(error).__name__
    except RankStopped as error:
        return f"{type(error).__name__}: {error}"


SCENARIOS = {"by_hand": by_hand, "with_service": with_service, "one_rank_fails": one_rank_fails}


def _rank_main(names, rank, port, out_dir):
    faulthandler.dump_traceback_later(60, exit=True)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=30),
    )
    results = {}
    for name in names:
        try:
            results[name] = SCENARIOS[name](rank)
        except Exception as error:  # noqa: BLE001 - reported to the test
            results[name] = ("error", type(error).__name__, str(error))
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as file:
        pickle.dump(results, file)
    dist.destroy_process_group()


def launch(names, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # forked from one spawned launcher that imports torch once for both ranks
    args = [(names, rank, port, str(tmp_path)) for rank in range(WORLD)]
    fork_ranks(_rank_main, args, limit=85)
    results = []
    for rank in range(WORLD):
        with open(tmp_path / f"rank{rank}.pkl", "rb") as file:
            results.append(pickle.load(file))
    return {name: [r[name] for r in results] for name in names}


@pytest.mark.timeout(150)
def test_ranks_end_together_by_hand_with_the_service_and_on_errors(tmp_path):
    results = launch(list(SCENARIOS), tmp_path)
    rank0, rank1 = results["by_hand"]
    assert rank0 == list(range(0, 22, 2)) and rank1 == list(range(1, 22, 2))  # 11 each
    epochs0, epochs1 = results["with_service"]
    assert len(epochs0[0]) == len(epochs1[0]) == 6 and epochs0[0] == epochs0[1]
    assert sorted(x for batch in epochs0[0] + epochs1[0] for x in batch) == list(range(23))
    stopped, failed = results["one_rank_fails"]
    assert failed == "KeyError"  # rank 0 names the rank whose output has the error
    assert stopped.startswith("RankStopped: fullsync(): rank 1 raised an error"), stopped


def test_one_process_passes_items_through():
    dp = IterableWrapper(range(5)).fullsync()
    assert isinstance(dp, FullSync) and list(dp) == list(range(5)) and len(dp) == 5
    assert repr(dp) == "FullSync(timeout=1800)"


@pytest.mark.parametrize("bad", [0, -1, "60", True])
def test_bad_timeout_is_rejected(bad):
    with pytest.raises(ValueError, match=f"timeout must be a number of seconds > 0, got {bad!r}"):
        IterableWrapper([]).fullsync(timeout=bad)


def test_resume_from_every_step():
    check_resume_from_every_step(lambda: IterableWrapper(range(5)).batch(2).fullsync())


def test_same_output_everywhere():
    epochs = check_same_output_everywhere(
        lambda: IterableWrapper(range(9)).shuffle().sharding_filter().batch(2).fullsync()
    )
    assert sorted(x for batch in epochs[0] for x in batch) == list(range(9))
