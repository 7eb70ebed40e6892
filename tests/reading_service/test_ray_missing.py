"""Without Ray, RayReadingService says which extra to install (runs with or without Ray)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HIDE_RAY = """
import sys
import pipeloom
from pipeloom.reading_service import RayReadingService
assert "ray" not in sys.modules, "import pipeloom must not import Ray (a second per worker)"
sys.modules["ray"] = None  # import ray raises ImportError, as when it is not installed
try:
    RayReadingService(2)
except ImportError as error:
    print(error)
else:
    raise SystemExit("no ImportError")
"""


@pytest.mark.timeout(120)
def test_pipeloom_imports_without_ray_and_the_service_names_the_extra():
    result = subprocess.run(
        [sys.executable, "-c", HIDE_RAY], capture_output=True, text=True, timeout=110
    )
    assert result.returncode == 0, result.stderr
    assert "pipeloom[ray]" in result.stdout and "RayReadingService needs Ray" in result.stdout
