import pytest

from pipeloom.queues import LocalQueue, Location, ProcessQueue, ThreadQueue, make_queue


@pytest.mark.parametrize(
    ("producer", "consumer", "kind"),
    [
        ("main", "main", LocalQueue),
        ("main/loader", "main", ThreadQueue),
        (Location("worker-0"), Location("main"), ProcessQueue),
        ("worker-0/io", "worker-1/io", ProcessQueue),
    ],
)
def test_factory_picks_the_queue_for_the_two_locations(producer, consumer, kind):
    with make_queue(producer, consumer, capacity=3) as q:
        assert type(q) is kind and q.capacity == 3


def test_location_labels_are_validated():
    with pytest.raises(ValueError, match="non-empty label"):
        Location("")
    assert str(Location.parse("w/t")) == "w/t"


def test_in_process_queues_reject_process_options():
    with pytest.raises(TypeError, match="unexpected options"):
        make_queue("main", "main", owner="consumer")
