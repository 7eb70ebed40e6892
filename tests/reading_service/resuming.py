"""The resume check shared by the reading-service tests."""

from __future__ import annotations

import pickle

from pipeloom import DataLoader


def resume_case(build, make_service, stop: int, seed: int = 3, compare=lambda items: items):
    """Checkpoint epoch 1 after ``stop`` items, resume in a fresh loader: same epochs 1 and 2.

    The loader that checkpoints reads on, as a trainer does after saving: its epoch 1 is
    the uninterrupted one the resumed loader must complete (one loader, where a second
    stopped at ``stop`` used to start another worker pool; ``stop`` past the epoch's
    end: the state after its last item).
    """
    with DataLoader(build(), make_service(), seed=seed) as loader:
        list(loader)  # epoch 0
        iterator = iter(loader)  # epoch 1, read to its end
        items: list = []
        while True:
            if len(items) <= stop:  # the last one taken: after min(stop, epoch) items
                state = pickle.dumps(loader.state_dict())
            try:
                items.append(next(iterator))
            except StopIteration:
                break
        expected = compare(items)
        following = compare(list(loader))  # epoch 2
    head = expected[: min(stop, len(expected))]
    with DataLoader(build(), make_service(), seed=seed + 1) as resumed:
        resumed.load_state_dict(pickle.loads(state))
        tail = compare(list(resumed))
        assert head + tail == expected
        assert compare(list(resumed)) == following
