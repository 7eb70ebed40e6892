"""``profile --auto``'s one line about what the tuner chose."""

from pipeloom.autotune import Config
from pipeloom.cli._profile import autotune_line


def test_the_command_line_says_whether_the_tuner_settled():
    best = Config("threads", 4, 2).to_dict()
    settled = {"settled": True, "config": best, "best": best, "chosen": "4 worker threads"}
    assert autotune_line(settled) == "autotune chose: 4 worker threads"
    running = {**settled, "settled": False, "chosen": "8 worker threads, prefetch 2"}
    line = autotune_line(running)
    assert line.startswith("autotune: best measured 4 worker threads, prefetch 2; it was still")
    assert "running 8 worker threads, prefetch 2" in line
