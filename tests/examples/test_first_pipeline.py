"""examples/first_pipeline.py runs and is reproducible."""

from __future__ import annotations

import importlib.util
import pathlib

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "first_pipeline.py"


def load_example():
    spec = importlib.util.spec_from_file_location("first_pipeline", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_first_pipeline_yields_every_row_once_per_epoch_reproducibly(capsys):
    example = load_example()
    seen = example.main(["--epochs", "2"])
    assert "epoch 1 batch 0" in capsys.readouterr().out
    per_epoch = len(seen) // 2
    first, second = seen[:per_epoch], seen[per_epoch:]
    assert sorted(i for batch in first for i in batch) == list(range(100))
    assert sorted(i for batch in second for i in batch) == list(range(100))
    assert first != second  # a new shuffle each epoch
    assert example.main(["--epochs", "2"]) == seen  # same seed, same batches
