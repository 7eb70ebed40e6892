"""examples/lm_data.py runs: mixes 2:1:1, packs or buckets, resumes on another worker count."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "lm_data.py"


def load_example():
    spec = importlib.util.spec_from_file_location("lm_data", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("argv", "padding_below"),
    [
        (["--mode", "pack", "--workers", "2", "--resume-workers", "3"], 0.05),
        (["--mode", "bucket", "--workers", "3", "--resume-workers", "1"], 0.25),
    ],
)
def test_mixes_at_the_weights_and_resumes_exactly_on_another_worker_count(
    argv, padding_below, capsys
):
    summary = load_example().main(argv)  # asserts that the resumed epoch is identical
    assert "identical" in capsys.readouterr().out
    assert summary["shares"] == {"web": 0.5, "books": 0.25, "code": 0.25}
    assert summary["padding"] < padding_below
