"""``python -m pipeloom profile``: a wrong command line gets one line; the user's own errors keep
their traceback (run in-process through ``main``, as ``python -m pipeloom`` calls it)."""

from __future__ import annotations

import sys
import traceback

import pytest

from pipeloom.cli import main

USER_MODULE = """
import pipeloom
from pipeloom.datapipes import IterableWrapper

def number():
    return 42

def broken_build():
    raise ValueError("boom while building")

def fails_at(x):
    if x == 7:
        raise ValueError(f"item {x} is bad")
    return x

def failing():
    return IterableWrapper(range(20)).map(fails_at).batch(4)

def loader():
    return pipeloom.DataLoader(IterableWrapper(range(8)), seed=0)
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"cli_user_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("{m}:number",), "{m}:number returned int: cannot use int as a pipeline source"),
        (("absent_module_xyz:build",), "cannot import 'absent_module_xyz'"),
        (("{m}:failing", "--batches", "0"), "argument --batches: expected an integer >= 1, got 0"),
        (("{m}:failing", "--workers", "-1"), "argument --workers: expected an integer >= 0"),
        (("no_colon",), "expected module:function"),
        (("{m}:missing",), "has no function 'missing'"),
        (("{m}:loader", "--workers", "2"), "already"),
        (
            ("{m}:failing", "--auto", "--strategy", "chunked"),
            "--auto tunes threads and classic worker processes",
        ),
    ],
)
def test_a_wrong_command_line_gets_one_line_and_status_2(user_module, capsys, args, message):
    argv = ["profile", *(a.format(m=user_module) for a in args), "--out", "out"]
    try:
        status = main(argv)
    except SystemExit as stop:  # argparse's own errors
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2
    assert message.format(m=user_module) in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("function", "names"),
    [
        ("broken_build", ["boom while building", "in broken_build"]),
        ("failing", ["item 7 is bad", "Mapper(fn=fails_at)", "position 7", "in fails_at"]),
    ],
)
def test_an_error_of_the_users_code_keeps_its_traceback(user_module, function, names):
    # They used to be caught as ValueErrors and printed as one line: no file, no line,
    # and in-process not even the block and the item.
    with pytest.raises(ValueError) as raised:
        main(["profile", f"{user_module}:{function}", "--out", "out"])
    shown = "".join(traceback.format_exception(raised.value))
    for name in names:
        assert name in shown


def test_an_import_error_inside_the_users_module_keeps_its_traceback(tmp_path, monkeypatch):
    (tmp_path / "cli_imports_missing.py").write_text("import absent_package_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="absent_package_xyz"):
        main(["profile", "cli_imports_missing:build"])
