"""Rules about the code base itself: dependency direction, no sleep-polling."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "pipeloom"

# package -> packages it must not import
FORBIDDEN = {
    "datapipes": {"graph", "reading_service", "queues", "loader", "compat"},
    "graph": {"reading_service", "queues", "loader", "compat"},
    "queues": {"datapipes", "graph", "reading_service", "loader", "compat"},
    "reading_service": {"loader", "compat"},
}


def imported_pipeloom_packages(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level >= 2 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 0 and node.module and node.module.startswith("pipeloom."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pipeloom."):
                    found.add(alias.name.split(".")[1])
    return found


def test_dependencies_point_one_way():
    problems = []
    for package, forbidden in FORBIDDEN.items():
        for path in (PACKAGE / package).rglob("*.py"):
            bad = imported_pipeloom_packages(path) & forbidden
            if bad:
                problems.append(f"{path.relative_to(PACKAGE)} imports {sorted(bad)}")
    assert not problems, "\n".join(problems)


def test_the_package_never_sleeps_in_a_loop():
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "time.sleep(" in line or "from time import sleep" in line
    ]
    assert not offenders, f"waiting must be event driven, found sleeps at {offenders}"
