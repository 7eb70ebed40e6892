"""Record what torchdata 0.9 yields for the migration pipelines (tests/migration/pipelines).

Run it where torchdata 0.9 is installed (it is not a pipeloom dependency), e.g.::

    python3 -m venv /tmp/tdvenv --system-site-packages
    /tmp/tdvenv/bin/pip install --no-deps torchdata==0.9.0
    /tmp/tdvenv/bin/pip install requests "portalocker>=2" "protobuf==3.20.3"
    PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python \\
    PYTHONPATH=<a venv with torch 2.x, numpy, Pillow>/site-packages \\
        /tmp/tdvenv/bin/python scripts/record_torchdata_fixtures.py

(torchdata's TFRecord reader was generated for protobuf 3.20.)

It also writes ``tests/migration/torchdata_names.json``: every functional
name torchdata 0.9 registered (iterable and map-style) with the class behind
it, which the test checks docs/migrating_from_torchdata.md against.

Each pipeline file is torchdata code run unchanged on the files that
``tests/migration/make_data.py`` writes (HTTP from a server on 127.0.0.1);
its outputs go to ``tests/migration/fixtures/<pipeline>.json``. The test
runs the same files with ``torchdata`` replaced by ``pipeloom`` in the
imports and compares.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import tempfile
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
MIGRATION = ROOT / "tests" / "migration"
sys.path.insert(0, str(ROOT))  # the repository: tests is a package there

from tests.migration.harness import run, serve  # noqa: E402
from tests.migration.make_data import make_data  # noqa: E402


def record_names() -> None:
    """torchdata 0.9's registry of functional names (private dataframe ones left out)."""
    import inspect

    import torchdata.datapipes  # noqa: F401 - registers every functional name
    from torch.utils.data import IterDataPipe, MapDataPipe

    names = {}
    for kind, base in (("iter", IterDataPipe), ("map", MapDataPipe)):
        entries = {}
        for name, function in sorted(base.functions.items()):
            if name.startswith("_"):
                continue
            cls = function.args[0] if getattr(function, "args", None) else function
            made_by = cls.__new__ if "__new__" in vars(cls) else cls.__init__
            signature = str(inspect.signature(made_by))
            signature = signature.replace("(self, ", "(").replace("(cls, ", "(")
            entries[name] = {"class": cls.__name__, "signature": _short(signature)}
        names[kind] = entries
    target = MIGRATION / "torchdata_names.json"
    target.write_text(json.dumps(names, indent=1) + "\n")
    print(f"{len(names['iter'])} iterable and {len(names['map'])} map-style names -> {target.name}")


def _short(signature: str) -> str:
    import re

    signature = re.sub(r"<function (\w+) at 0x[0-9a-f]+>", r"\1", signature)
    signature = re.sub(r"<class '([\w.]+)'>", r"\1", signature)
    return signature.replace("torch.utils.data.datapipes.datapipe.", "")


def record(name: str | None = None) -> None:
    import torch
    import torchdata

    warnings.filterwarnings("ignore")  # torchdata 0.9 warns that it is deprecated, at each use
    if name is None:
        record_names()
    for path in sorted((MIGRATION / "pipelines").glob("*.py")):
        if name is not None and path.stem != name:
            continue
        spec = importlib.util.spec_from_file_location(f"torchdata_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        torch.manual_seed(0)  # torchdata's shuffles draw from torch's generator
        with tempfile.TemporaryDirectory() as folder:
            root = str(make_data(pathlib.Path(folder)))
            with serve(f"{root}/served") as base_url:
                outputs = run(module, root, base_url)
        fixture = {
            "pipeline": path.name,
            "recorded_with": f"torchdata {torchdata.__version__}",
            "order": getattr(module, "ORDER", "exact"),
            "outputs": outputs,
        }
        target = MIGRATION / "fixtures" / f"{path.stem}.json"
        target.write_text(json.dumps(fixture, indent=1, sort_keys=False) + "\n")
        print(f"{path.name}: {sum(len(v) for v in outputs.values())} items -> {target.name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="record one pipeline (its file name without .py)")
    record(parser.parse_args().only)
