import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))


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
