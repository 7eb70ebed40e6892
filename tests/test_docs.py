"""Every ```python block in docs/ runs (each page's blocks in order, one namespace)."""

from __future__ import annotations

import os
import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
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
