"""Fuzz mid-epoch resume: random pipelines stopped under one service, resumed under another.

Usage::

    python scripts/fuzz_resume.py --seed 0 --count 200 [--kinds in_process,threads,processes]
        [--modes ranks,slow_starts]

``--modes`` widens what each seed draws (a seed without modes draws what it always
drew): ``ranks`` runs one rank's share under outer sharding and checks the shares
of all ranks partition the epoch; ``slow_starts`` sometimes starts worker processes
by spawn or forkserver (slow); ``warm_starts`` sometimes does so with
``warm_start=True``. ``--loader compat`` fuzzes the torch drop-in
(``pipeloom.compat.DataLoader`` over map-style datasets) instead; ``--kinds`` and
``--modes`` do not apply there. ``--loader elastic`` stops an epoch on some ranks
(threads of this process running ``DistributedReadingService``), joins their states
and resumes on another number of ranks (``tests/fuzzing/elastic.py``). ``--loader lifecycle``
runs a random sequence of loader operations (iter, break, state_dict from another
thread, load_state_dict into a new loader, set_epoch, end_epoch, shutdown, dropping
the loader under gc.disable(), ...) on a service and in-process in lockstep, and
compares every result (``tests/fuzzing/lifecycle.py``; ``--kinds`` may add ``auto``).

Prints one line per example (``seed=N kind: detail | plan``) and a summary;
exits 1 if any example gave wrong data, raised where in-process did not, or
hung. Repeat one example with ``--seed N --count 1``. The machinery lives in
``tests/fuzzing/`` (``tests/test_fuzz_resume_smoke.py`` runs a few seeds).
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository: tests is a package there

from tests.fuzzing.compat import run_compat_example  # noqa: E402
from tests.fuzzing.elastic import run_elastic_example  # noqa: E402
from tests.fuzzing.lifecycle import KINDS as LIFECYCLE_KINDS  # noqa: E402
from tests.fuzzing.lifecycle import run_lifecycle_example  # noqa: E402
from tests.fuzzing.resume import MODES, run_example  # noqa: E402

KINDS_DEFAULT = "in_process,threads,processes"  # lifecycle: and auto


def shm_entries() -> set[str]:
    """This user's entries in /dev/shm (a loader left running leaves its segments there)."""
    mine = set()
    for entry in os.scandir("/dev/shm") if os.path.isdir("/dev/shm") else ():
        try:
            if entry.stat().st_uid == os.getuid():
                mine.add(entry.name)
        except OSError:
            pass  # removed meanwhile
    return mine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="the first example's seed")
    parser.add_argument("--count", type=int, default=200, help="how many examples")
    parser.add_argument(
        "--kinds",
        default=KINDS_DEFAULT,
        help="the services to draw from, comma separated",
    )
    parser.add_argument("--modes", default="", help=f"comma separated, some of {', '.join(MODES)}")
    parser.add_argument(
        "--loader",
        choices=["pipeloom", "compat", "elastic", "lifecycle"],
        default="pipeloom",
        help="pipeloom.DataLoader over random pipelines, the torch drop-in, ranks, or "
        "random sequences of loader operations",
    )
    parser.add_argument("--watchdog", type=float, default=60.0, help="seconds per example")
    parser.add_argument("--quiet", action="store_true", help="print only failures and refusals")
    args = parser.parse_args()
    kinds = tuple(args.kinds.split(","))
    modes = frozenset(filter(None, args.modes.split(",")))
    shm_before = shm_entries()
    counts: collections.Counter[str] = collections.Counter()
    failed = []
    started = time.monotonic()
    for seed in range(args.seed, args.seed + args.count):
        if args.loader == "compat":
            outcome = run_compat_example(seed, watchdog_s=args.watchdog)
        elif args.loader == "elastic":
            outcome = run_elastic_example(seed, timeout_s=args.watchdog / 2)
        elif args.loader == "lifecycle":
            lifecycle_kinds = kinds if args.kinds != KINDS_DEFAULT else LIFECYCLE_KINDS
            outcome = run_lifecycle_example(seed, lifecycle_kinds, watchdog_s=args.watchdog)
        else:
            outcome = run_example(seed, kinds, watchdog_s=args.watchdog, modes=modes)
        counts[outcome.kind] += 1
        if outcome.failed:
            failed.append(seed)
        if not args.quiet or outcome.kind not in ("ok", "invalid"):
            print(outcome.line(), flush=True)
    left = sorted(shm_entries() - shm_before)
    print(
        f"summary: {args.count} examples from seed {args.seed} in "
        f"{time.monotonic() - started:.0f} s: {dict(sorted(counts.items()))}; "
        f"failed seeds {failed}; left in /dev/shm: {left}",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
