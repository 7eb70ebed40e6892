"""torchdata 0.9 pipelines ported by changing their imports give torchdata's outputs.

Each file in ``pipelines/`` is torchdata code from its documentation and
tutorials. ``scripts/record_torchdata_fixtures.py`` ran them under torchdata
0.9 and saved what they yielded in ``fixtures/``; here the same files run
with ``torchdata`` replaced by ``pipeloom`` in their import lines, and
nothing else changed.
"""

from __future__ import annotations

import json
import pathlib
import re
import types

import pytest

from pipeloom.datapipes import IterDataPipe
from tests.migration.harness import canonical, run, serve
from tests.migration.make_data import make_data

HERE = pathlib.Path(__file__).resolve().parent

PIPELINES = sorted(p.stem for p in (HERE / "pipelines").glob("*.py"))
IMPORT = re.compile(r"^(import|from)\s+torchdata\.datapipes\b")


def port(name: str) -> types.ModuleType:
    """The pipeline module with ``torchdata.datapipes`` -> ``pipeloom.datapipes`` in its imports."""
    original = (HERE / "pipelines" / f"{name}.py").read_text().splitlines(keepends=True)
    ported = [
        line.replace("torchdata.datapipes", "pipeloom.datapipes") if IMPORT.match(line) else line
        for line in original
    ]
    assert all("torchdata" not in line for line in ported if line.startswith(("import", "from")))
    module = types.ModuleType(f"ported_{name}")
    exec(compile("".join(ported), f"pipelines/{name}.py (ported)", "exec"), module.__dict__)
    return module


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", PIPELINES)
def test_ported_pipeline_gives_torchdatas_output(name, tmp_path):
    fixture = json.loads((HERE / "fixtures" / f"{name}.json").read_text())
    module = port(name)
    root = str(make_data(tmp_path / "data"))
    with serve(f"{root}/served") as base_url:
        got = run(module, root, base_url)
    order = fixture["order"]
    expected = fixture["outputs"]
    assert sorted(got) == sorted(expected)
    for output in expected:
        assert canonical({output: got[output]}, order) == canonical(
            {output: expected[output]}, order
        ), f"{name}: output {output!r} differs from torchdata 0.9's"


def test_every_pipeline_has_a_fixture_and_only_imports_change():
    fixtures = sorted(p.stem for p in (HERE / "fixtures").glob("*.json"))
    assert fixtures == PIPELINES
    for name in PIPELINES:
        source = (HERE / "pipelines" / f"{name}.py").read_text()
        assert any(IMPORT.match(line) for line in source.splitlines()), name


def _page_rows() -> dict[tuple[str, str], str]:
    """``(kind, name) -> status`` from the tables of docs/migrating_from_torchdata.md."""
    page = (HERE.parents[1] / "docs" / "migrating_from_torchdata.md").read_text()
    rows: dict[tuple[str, str], str] = {}
    kind = "iter"
    for line in page.splitlines():
        if line.startswith("### Map-style"):
            kind = "map"
        found = re.match(r"^\| `(\w+)` \| ([^|]+) \|", line)
        if found:
            rows[(kind, found.group(1))] = found.group(2).strip()
    return rows


def test_the_migration_page_lists_every_torchdata_name_truthfully():
    from pipeloom.datapipes import MapDataPipe

    registry = json.loads((HERE / "torchdata_names.json").read_text())
    rows = _page_rows()
    assert len(registry["iter"]) == 84 and len(registry["map"]) == 8
    expected = {(kind, name) for kind in ("iter", "map") for name in registry[kind]}
    assert set(rows) == expected
    for (kind, name), status in rows.items():
        base = IterDataPipe if kind == "iter" else MapDataPipe
        exists = hasattr(base, name)
        if status in ("yes", "refused, says how to port"):
            assert exists, f"the page says {kind} {name!r} exists"
        else:
            assert not exists, (
                f"{kind} {name!r} exists now: update its row in docs/migrating_from_torchdata.md "
                f"(it says {status!r})"
            )
