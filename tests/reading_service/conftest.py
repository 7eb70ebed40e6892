"""Fixtures shared by the reading-service test modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """One small local Ray cluster for every Ray test module (test_ray.py and
    test_ray_attacks.py, which run last: ``RUN_LAST`` in tests/conftest.py).

    Each module used to start its own and stop it after its tests: a cluster's start
    (raylet, GCS, agents, two prestarted workers) costs 5-9 s on a busy machine and
    its ``ray.shutdown()`` 1.5 s. The actors are the loaders' own, killed at their
    ``shutdown()``, so the modules share nothing else.
    """
    from tests.reading_service import ray_pipelines

    yield from ray_pipelines.local_cluster(str(tmp_path_factory.mktemp("ray")))
