"""pipeloom's tests, a package: helpers are imported as ``tests.<folder>.<module>``."""
