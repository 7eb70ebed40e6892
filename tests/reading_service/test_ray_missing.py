"""Without Ray, RayReadingService says which extra to install (runs with or without Ray)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HIDE_RAY = """
import sys
sys.modules["ray"] = None  # import ray raises ImportError, as when it is not installed
import pipeloom
from pipeloom.reading_service import RayReadingService
try:
    RayReadingService(2)
except ImportError as error:
    print(error)
else:
    raise SystemExit("no ImportError")
"""


@pytest.mark.timeout(120)
def test_without_ray_the_service_raises_import_error_naming_the_extra():
    result = subprocess.run(
        [sys.executable, "-c", HIDE_RAY], capture_output=True, text=True, timeout=110
    )
    assert result.returncode == 0, result.stderr
    assert "pipeloom[ray]" in result.stdout and "RayReadingService needs Ray" in result.stdout
