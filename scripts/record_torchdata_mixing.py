"""Record torchdata 0.9's outputs of ``max_token_bucketize`` and ``mux_longest`` as fixtures.

Run once, where torchdata 0.9 is installed (it is not a dependency)::

    pip install --no-deps torchdata==0.9.0
    python scripts/record_torchdata_mixing.py

It writes ``tests/datapipes/fixtures/torchdata_mixing.json``: random inputs
(fixed seeds), the arguments, and torchdata's output for each;
``tests/datapipes/test_max_token_bucketize.py`` and ``test_mux.py`` check
that pipeloom gives the same.
"""

from __future__ import annotations

import json
import pathlib
import random
import warnings

OUT = pathlib.Path(__file__).resolve().parents[1] / "tests/datapipes/fixtures/torchdata_mixing.json"


def bucketize_cases(iter_wrapper) -> list[dict]:
    cases = []
    for seed in range(40):
        rng = random.Random(seed)
        items = ["x" * rng.randint(0, 12) + str(i) for i in range(rng.randint(0, 60))]
        max_token_count = rng.randint(13, 40)
        kwargs = {
            "max_token_count": max_token_count,
            "min_len": rng.choice([0, 0, 3]),
            "max_len": rng.choice([None, max_token_count, 10]),
            "buffer_size": rng.choice([1, 3, 8, 1000]),
            "include_padding": rng.random() < 0.5,
        }
        out = list(iter_wrapper(items).max_token_bucketize(**kwargs))
        cases.append({"items": items, "kwargs": kwargs, "expected": [list(b) for b in out]})
    return cases


def mux_longest_cases(iter_wrapper) -> list[dict]:
    cases = []
    for seed in range(20):
        rng = random.Random(seed)
        lists = [
            list(range(100 * k, 100 * k + rng.randint(0, 9))) for k in range(rng.randint(1, 4))
        ]
        out = list(iter_wrapper(lists[0]).mux_longest(*(iter_wrapper(x) for x in lists[1:])))
        cases.append({"lists": lists, "expected": out})
    return cases


def main() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchdata
        from torchdata.datapipes.iter import IterableWrapper

    fixtures = {
        "torchdata_version": torchdata.__version__,
        "max_token_bucketize": bucketize_cases(IterableWrapper),
        "mux_longest": mux_longest_cases(IterableWrapper),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    lines = [f'"torchdata_version": {json.dumps(fixtures.pop("torchdata_version"))}']
    for name, cases in fixtures.items():  # one case per line
        body = ",\n  ".join(json.dumps(case, separators=(",", ":")) for case in cases)
        lines.append(f'"{name}": [\n  {body}\n ]')
    OUT.write_text("{\n " + ",\n ".join(lines) + "\n}\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
