import gc

import pytest

from tests.own_resources import OwnResources


@pytest.fixture
def no_shm_leak():
    """Fails the test if this process tree still holds a child, thread, fd or memfd after it.

    Only the test's own resources count: other jobs on the machine create and
    hold entries in /dev/shm (and processes) of their own meanwhile.
    """
    before = OwnResources()
    yield
    gc.collect()  # what the test's frames and exceptions held in cycles
    before.assert_released(timeout=10)
