"""examples/profile_decode.py runs, and its statistics name decode as the slow stage."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "profile_decode.py"


def load_example():
    spec = importlib.util.spec_from_file_location("profile_decode", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(90)
def test_the_statistics_name_decode(capsys):
    stats = load_example().main(["--items", "160", "--workers", "2"])
    assert stats.outputs == 10
    assert stats.stages[0].stage == "Mapper(decode)", stats
    assert stats.stages[0].placement == "worker processes"
    assert (
        "verdict: loader-bound: Mapper(decode) in the worker processes" in capsys.readouterr().out
    )
