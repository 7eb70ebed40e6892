"""``python -m pipeloom``: see :mod:`pipeloom.cli`."""

from pipeloom.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
