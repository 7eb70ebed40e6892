"""Rules about the code base itself, checked on the source (see STYLE.md).

- packages depend one way: ``datapipes`` <- ``graph`` <- ``reading_service`` -> ``queues``;
- a package reaches another only through its public names, never a ``_private`` module;
- only the block base touches the framework's ``_pl_*`` state of blocks;
- waiting is event driven: no sleeps, no ``Event().wait(x)`` used as one;
- modules stay small enough to read;
- tests import pipeloom's public names, and their helpers as a package.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeloom"
TESTS = ROOT / "tests"
MAX_MODULE_LINES = 500
BLOCK_BASE = PACKAGE / "datapipes" / "_base.py"
# Folders of Python files that are data, never imported (torchdata code run by a test).
NOT_PACKAGES = {"tests/migration/pipelines"}

# package -> packages it must not import
FORBIDDEN = {
    "datapipes": {"graph", "reading_service", "queues", "loader", "compat"},
    "graph": {"reading_service", "queues", "loader", "compat"},
    "queues": {"datapipes", "graph", "reading_service", "loader", "compat"},
    "reading_service": {"loader", "compat"},
    "autotune": {"loader", "compat"},
}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: pathlib.Path) -> list[tuple[str, str | None, int]]:
    """``(absolute module, imported name or None, line)`` for every import in ``path``."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [(module, alias.name, node.lineno) for alias in node.names]
    return found


def top_package(module: str) -> str | None:
    """``datapipes`` for ``pipeloom.datapipes._base``; None outside pipeloom's subpackages."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "pipeloom" else None


def private_part(module: str, name: str | None) -> str | None:
    """The first ``_private`` component below pipeloom's subpackage (module or name)."""
    parts = module.split(".")[2:] + ([name] if name else [])
    return next((p for p in parts if p.startswith("_") and not p.startswith("__")), None)


def test_dependencies_point_one_way():
    problems = []
    for package, forbidden in FORBIDDEN.items():
        for path in (PACKAGE / package).rglob("*.py"):
            bad = {top_package(module) for module, _, _ in imports(path)} & forbidden
            if bad:
                problems.append(f"{path.relative_to(PACKAGE)} imports {sorted(bad)}")
    assert not problems, "\n".join(problems)


def test_packages_reach_each_other_through_public_names_only():
    problems = []
    for path in PACKAGE.rglob("*.py"):
        own = top_package(module_name(path))
        for module, name, line in imports(path):
            other = top_package(module)
            if other is None or other == own or not (PACKAGE / other).is_dir():
                continue  # stdlib, pipeloom's own root modules (_validate, errors), same package
            private = private_part(module, name)
            if private:
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {private} of {other}")
    assert not problems, "give these a public seam instead:\n" + "\n".join(problems)


def test_only_the_block_base_touches_framework_state():
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in PACKAGE.rglob("*.py")
        if path != BLOCK_BASE
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "_pl_" in line
    ]
    assert not offenders, f"use the block base's methods, found _pl_ at {offenders}"


def test_the_package_never_sleeps_in_a_loop():
    sleeping = re.compile(r"time\.sleep\(|from time import sleep|Event\(\)\.wait\(")
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if sleeping.search(line)
    ]
    assert not offenders, f"waiting must be event driven, found sleeps at {offenders}"


def test_modules_stay_small():
    long = {
        str(path.relative_to(ROOT)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split modules past {MAX_MODULE_LINES} lines: {long}"


def test_tests_import_helpers_as_a_package_without_path_hacks():
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in TESTS.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "sys.path" in line and path.name != "test_architecture.py"
    ]
    assert not offenders, f"import test helpers from the tests package: {offenders}"
    missing = [
        str(folder.relative_to(ROOT))
        for folder in [TESTS, *(p for p in TESTS.rglob("*") if p.is_dir())]
        if any(folder.glob("*.py"))
        and not (folder / "__init__.py").exists()
        and folder.relative_to(ROOT).as_posix() not in NOT_PACKAGES
    ]
    assert not missing, f"test folders must be packages: {missing}"


# A test module may import private helpers of the module it tests
# (tests/<package>/test_<name>.py or test_<package>_<name>.py -> pipeloom/<package>/_<name>.py);
# beyond that:
PRIVATE_IMPORTS_ALLOWED = {
    "tests/reading_service/test_lifecycle.py": {"_files"},  # watches open() by monkeypatching it
    "tests/datapipes/test_on_disk_cache.py": {"_cache_files"},  # the cache's file lock
    "tests/compat/test_compat_loader.py": {"_plan", "_engine"},
    "tests/datapipes/test_reader_attacks.py": {"_crc32c"},  # writes TFRecord frames
    "tests/datapipes/test_valid_inputs.py": {"_crc32c"},  # writes TFRecord frames
    # collates small batches into warm buffers and a worker's queue (thresholds patched)
    "tests/compat/test_collate_attacks.py": {"_warm", "_process", "_context"},
}


def test_tests_import_public_names():
    problems = []
    for path in TESTS.rglob("*.py"):
        allowed = PRIVATE_IMPORTS_ALLOWED.get(str(path.relative_to(ROOT)), set())
        if path.stem.startswith("test_"):  # test_<name>.py or test_<folder>_<name>.py
            name = path.stem.removeprefix("test_")
            allowed = allowed | {"_" + name, "_" + name.removeprefix(path.parent.name + "_")}
        for module, name, line in imports(path):
            if top_package(module) is None:
                continue
            private = private_part(module, name)
            if private and private not in allowed:
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {module}.{name}")
    assert not problems, "import the public name instead:\n" + "\n".join(problems)
