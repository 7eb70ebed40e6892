"""Shared by every test: nothing yet (helpers are modules of the tests package)."""
