"""CRC-32C: the NumPy lanes and rows, and google-crc32c where installed, give the byte
loop's value (TFRecord frames)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeloom.datapipes import _crc32c
from pipeloom.datapipes._crc32c import _crc_loop, crc32c, crc32c_many, masked_crc32c


@pytest.fixture(autouse=True, params=["numpy", "google-crc32c"])
def implementation(request, monkeypatch):
    """Every test runs on the NumPy code and, where installed, on google-crc32c."""
    if request.param == "numpy":
        monkeypatch.setattr(_crc32c, "_FAST", None)
    elif _crc32c._FAST is None:
        pytest.skip("google-crc32c is not installed (pip install google-crc32c)")
    return request.param


@given(size=st.integers(0, 300_000), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_crc32c_by_lanes_equals_the_byte_loop(size, seed):
    data = random.Random(seed).randbytes(size)
    assert crc32c(data) == _crc_loop(memoryview(data), 0xFFFFFFFF) ^ 0xFFFFFFFF


@given(
    lengths=st.lists(st.integers(0, 5000), min_size=0, max_size=40),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=60, deadline=None)
def test_crc32c_many_equals_one_at_a_time(lengths, seed):
    rng = random.Random(seed)
    datas = [rng.randbytes(n) for n in lengths] + [rng.randbytes(100 + i) for i in range(20)]
    assert crc32c_many(datas) == [_crc_loop(memoryview(d), 0xFFFFFFFF) ^ 0xFFFFFFFF for d in datas]


def test_crc32c_known_values_small_and_large():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"\0" * 32) == 0x8A9136AA  # RFC 3720 B.4
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32)) * 1000) == _crc_loop(
        memoryview(bytes(range(32)) * 1000), 0xFFFFFFFF
    ) ^ (0xFFFFFFFF)


def test_masked_crc32c_of_nothing():
    assert masked_crc32c(b"") == 0xA282EAD8


def test_google_crc32c_without_its_compiled_code_is_not_used_and_does_not_warn(monkeypatch):
    # Where google-crc32c has no wheel (a free-threaded Python), it imports its pure-Python
    # byte loop with a RuntimeWarning: slower than the NumPy code, and an error under -W error.
    import builtins
    import types
    import warnings

    slow = types.ModuleType("google_crc32c")
    slow.implementation = "python"
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name != "google_crc32c":
            return real_import(name, *args, **kwargs)
        warnings.warn("pure python implementation", RuntimeWarning, stacklevel=2)
        return slow

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _crc32c._fast_crc32c() is None
