"""examples/train_compat.py: the same training losses with torch's loader and ours."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_compat.py"


def load_example():
    spec = importlib.util.spec_from_file_location("train_compat", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("num_workers", ["0", "2"])
def test_losses_are_identical_with_torchs_loader_and_ours(num_workers, capsys):
    results = load_example().main(["--short", "--num-workers", num_workers])
    (theirs, _), (ours, _) = results.values()
    assert len(theirs) == 2 and theirs == ours  # exactly, not approximately
    assert "losses identical: True" in capsys.readouterr().out
