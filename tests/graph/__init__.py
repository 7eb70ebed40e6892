"""pipeloom's tests."""
