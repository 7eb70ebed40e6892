"""The docs: every ```python block runs, checks something, and writes nothing into the
current directory; every ``pipeloom.`` name they mention exists."""

from __future__ import annotations

import importlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def pages():
    return sorted(DOCS.glob("*.md"))


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_python_blocks_in_docs_run(page, tmp_path, capsys):
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for number, code in enumerate(BLOCK.findall(page.read_text()), 1):
            try:
                exec(compile(code, f"{page.name}[block {number}]", "exec"), namespace)
            except Exception as error:  # pragma: no cover - message for the reader
                raise AssertionError(f"{page.name} block {number} failed: {error!r}") from error
    finally:
        os.chdir(cwd)
    written = sorted(path.name for path in tmp_path.iterdir())
    assert written == [], f"{page.name} wrote into the current directory; use a temporary one"


@pytest.mark.parametrize("page", [*pages(), ROOT / "README.md"], ids=lambda p: p.name)
def test_every_python_block_checks_what_it_shows(page):
    blocks = BLOCK.findall(page.read_text())
    unchecked = [
        number
        for number, code in enumerate(blocks, 1)
        if "assert" not in code and "check_" not in code  # pipeloom.testing's checkers assert
    ]
    assert unchecked == [], f"{page.name}: blocks {unchecked} assert nothing"


def test_the_readme_example_runs(tmp_path):
    (code,) = BLOCK.findall((ROOT / "README.md").read_text())[:1]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code, "README.md[block 1]", "exec"), {"__name__": "readme"})
    finally:
        os.chdir(cwd)
    assert list(tmp_path.iterdir()) == []


DOTTED = re.compile(r"(?<![\w/.])pipeloom(?:\.\w+)+")
FROM_IMPORT = re.compile(r"^\s*from (pipeloom[\w.]*) import \(?([\w, \n]+?)\)?$", re.M)


def mentioned_names(text: str) -> set[str]:
    """``pipeloom.a.b`` names in ``text``, and ``pipeloom.a.X`` for ``from pipeloom.a import X``."""
    names = set(DOTTED.findall(text))
    for module, imported in FROM_IMPORT.findall(text):
        for name in imported.replace("\n", " ").split(","):
            name = name.strip().split(" as ")[0]
            if name:
                names.add(f"{module}.{name}")
    return names


def resolve(dotted: str) -> object:
    """The object ``dotted`` names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:end]))
            break
        except ImportError:
            continue
    for attribute in parts[end:]:
        found = getattr(found, attribute)
    return found


@pytest.mark.parametrize("page", [*pages(), ROOT / "README.md"], ids=lambda p: p.name)
def test_every_pipeloom_name_in_the_docs_exists(page):
    missing = []
    for name in sorted(mentioned_names(page.read_text())):
        try:
            resolve(name)
        except AttributeError:
            missing.append(name)
    assert missing == [], f"{page.name} names what pipeloom does not have: {missing}"


def test_the_name_check_finds_a_name_that_does_not_exist():
    names = mentioned_names("raise `pipeloom.DistributedError`\nfrom pipeloom.errors import Nope")
    assert names == {"pipeloom.DistributedError", "pipeloom.errors", "pipeloom.errors.Nope"}
    for name in ("pipeloom.DistributedError", "pipeloom.errors.Nope"):
        with pytest.raises(AttributeError):
            resolve(name)


def test_pipeloom_compat_is_an_attribute_imported_on_first_use():
    code = (
        "import sys, pipeloom\n"
        "assert 'pipeloom.compat' not in sys.modules\n"
        "assert pipeloom.compat.DataLoader.__name__ == 'DataLoader'\n"
        "print('ok')"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.stdout.strip() == "ok", done.stderr
