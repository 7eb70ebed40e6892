"""The shared argument checks: one wording per mistake, the value returned."""

from __future__ import annotations

import datetime
import math

import pytest

from pipeloom import DataLoader
from pipeloom.datapipes import HttpReader, IterableWrapper
from pipeloom.reading_service import (
    DistributedReadingService,
    MultiProcessingReadingService,
)


def test_loader_refuses_a_truthy_string_for_a_bool_option():
    with pytest.raises(TypeError, match="resume_by_replay must be a bool, got str 'yes'"):
        DataLoader(IterableWrapper([1]), resume_by_replay="yes")


@pytest.mark.parametrize("epoch", [-1, 1.0, True])
def test_loader_epochs_are_ints_from_zero(epoch):
    loader = DataLoader(IterableWrapper([1]), seed=0)
    with pytest.raises(ValueError, match=f"epoch must be an int >= 0, got {epoch!r}"):
        loader.set_epoch(epoch)


def test_loader_seed_is_an_int_or_none():
    with pytest.raises(TypeError, match="seed must be an int or None, got float 1.5"):
        DataLoader(IterableWrapper([1]), seed=1.5)  # type: ignore[arg-type]


def test_distributed_timeout_accepts_a_timedelta_and_explains_other_values():
    service = DistributedReadingService(timeout=datetime.timedelta(seconds=3))
    assert service.timeout == 3
    with pytest.raises(ValueError, match="or a datetime.timedelta, got '3'"):
        DistributedReadingService(timeout="3")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "fix"),
    [
        (lambda: MultiProcessingReadingService(2, timeout=math.inf), "pass None to wait"),
        (lambda: HttpReader(IterableWrapper([]), deadline=math.inf), "pass None to wait"),
        (lambda: HttpReader(IterableWrapper([]), backoff=math.inf), "pass a large number"),
    ],
)
def test_an_infinite_number_of_seconds_is_refused_at_once(make, fix):
    # Accepted, it failed at the first wait with "OverflowError: timestamp out of range".
    with pytest.raises(ValueError, match=f"must be a finite number of seconds, got inf; {fix}"):
        make()
