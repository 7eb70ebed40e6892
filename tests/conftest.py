"""Shared by every test (helpers are modules of the ``tests`` package)."""

import faulthandler
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


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with pytest --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


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
