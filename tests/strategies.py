"""Hypothesis strategies shared by the test suite."""

from __future__ import annotations

from hypothesis import strategies as st

small_ints = st.integers(min_value=-1000, max_value=1000)
item_lists = st.lists(small_ints, max_size=60)
positive_sizes = st.integers(min_value=1, max_value=12)
shard_counts = st.integers(min_value=1, max_value=6)
seeds = st.integers(min_value=0, max_value=2**32 - 1)
