"""Shared by every test (helpers are modules of the ``tests`` package)."""

import faulthandler
import gc
import os
import sys

import pytest

WATCHDOG_GRACE_S = 60.0
"""Seconds past a test's pytest-timeout before the watchdog ends the run."""


def pytest_addoption(parser):
    parser.addoption(
        "--runslow", action="store_true", default=False, help="also run tests marked slow"
    )


def pytest_configure(config):
    # Capture is suspended here: fd 2 is the terminal (or CI log), not a capture file.
    config.watchdog_stderr = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")


def pytest_unconfigure(config):
    config.watchdog_stderr.close()


RUN_LAST = ("tests/reading_service/test_ray.py", "tests/reading_service/test_ray_attacks.py")
"""Modules run after every other: a Ray cluster, once started in this process, leaves
native threads and a socket behind after ``ray.shutdown()``, which a later test's check
of its own fds (``tests/own_resources.py``) would count as its leak (seen once in CI:
``test_separate``, a ``socket:[...]`` with no Python thread left). They share one
cluster, started once (``ray_cluster`` in tests/reading_service/conftest.py)."""


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.nodeid.startswith(RUN_LAST))  # stable: order kept
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with pytest --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Freeze what is alive once the tests are collected (torch, numpy, hypothesis, the
    test modules: some 300,000 objects, there for the whole run): later collections
    leave it out. The ``gc.collect()`` of the leftovers and cycle checks, before and
    after each multiprocess test, then walks only what was made since (the test's own
    loaders and their cycles, which it finds as before), in milliseconds instead of
    0.2-0.5 s each (tests/reading_service/test_separate.py, test_lifecycle.py and
    test_lifecycle_attacks.py spent 32 s of their 72 s in it on a busy machine)."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A watchdog that needs no GIL: a test frozen inside the interpreter (where
    pytest-timeout's signal handler can never run) dumps every thread's stack
    and ends the run instead of using up the CI budget."""
    marker = item.get_closest_marker("timeout")
    limit = float(marker.args[0] if marker and marker.args else item.config.getini("timeout"))
    faulthandler.dump_traceback_later(
        limit + WATCHDOG_GRACE_S, exit=True, file=item.config.watchdog_stderr
    )
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
