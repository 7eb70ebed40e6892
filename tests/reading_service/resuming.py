"""The resume check shared by the reading-service tests."""

from __future__ import annotations

import pickle

from pipeloom import DataLoader


def resume_case(build, make_service, stop: int, seed: int = 3, compare=lambda items: items):
    """Stop epoch 1 after ``stop`` items, resume in a fresh loader: same epochs 1 and 2."""
    with DataLoader(build(), make_service(), seed=seed) as loader:
        list(loader)  # epoch 0
        expected = compare(list(loader))  # epoch 1, uninterrupted
        following = compare(list(loader))  # epoch 2
    with DataLoader(build(), make_service(), seed=seed) as loader:
        list(loader)
        iterator = iter(loader)
        head = compare([next(iterator) for _ in range(min(stop, len(expected)))])
        state = pickle.loads(pickle.dumps(loader.state_dict()))
    with DataLoader(build(), make_service(), seed=seed + 1) as resumed:
        resumed.load_state_dict(state)
        tail = compare(list(resumed))
        assert head + tail == expected
        assert compare(list(resumed)) == following
