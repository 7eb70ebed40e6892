import os

import pytest


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:  # pragma: no cover
        return set()


@pytest.fixture
def no_shm_leak():
    """Fails the test if /dev/shm holds new entries after it."""
    before = _shm_entries()
    yield
    assert _shm_entries() - before == set()
