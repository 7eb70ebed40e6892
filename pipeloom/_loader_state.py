"""A ``DataLoader`` state's own fields: the version, the seed, the epoch and its progress."""

from __future__ import annotations

from typing import Any

from .datapipes import StateFields
from .errors import StateError

__all__ = ["STATE_VERSION", "UNCHECKED_VERSION", "no_replay_in_arrival_order", "read_state"]

STATE_VERSION = 2  # 2: a fingerprint of the pipeline and the count of delivered items
UNCHECKED_VERSION = 1  # states from before fingerprints: loaded with a warning


def read_state(state: Any) -> tuple[int, int, int, dict[str, Any] | None]:
    """``(seed, epoch, delivered, service state)`` of a loader state, each field checked."""
    version = state.get("version") if isinstance(state, dict) else None
    if type(version) is not int or version not in (STATE_VERSION, UNCHECKED_VERSION):
        got = version if isinstance(state, dict) else type(state).__name__
        raise StateError(
            f"expected a DataLoader state of version {STATE_VERSION} (or "
            f"{UNCHECKED_VERSION}, from older pipeloom), got {got!r}; pass what "
            f"DataLoader.state_dict() returned"
        )
    fields = StateFields("DataLoader state", state)
    seed = fields.int("seed", minimum=None)
    epoch = fields.int("epoch")
    delivered = fields.int("delivered") if version == STATE_VERSION else 0
    if "service" not in state:
        fields.fail("service", "None or a reading service's state", "(absent)")
    service = state["service"]
    if service is None:
        if delivered:
            fields.fail("delivered", "0 when no epoch was in progress (service is None)", delivered)
        return seed, epoch, delivered, None
    if not isinstance(service, dict) or not isinstance(service.get("kind"), str):
        fields.fail("service", "None or a reading service's state (a dict with a 'kind')", service)
    if service["kind"] == "replay":
        replayed = StateFields("DataLoader state (replay)", service).int("delivered")
        if version == STATE_VERSION and replayed != delivered:
            fields.fail("delivered", f"the replay count {replayed}", delivered)
        delivered = replayed
    return seed, epoch, delivered, service


def no_replay_in_arrival_order(delivered: int) -> StateError:
    """The refusal to resume by replay under a service that delivers in arrival order."""
    items = f"{delivered} item{'' if delivered == 1 else 's'}"
    return StateError(
        f"this state resumes by re-reading its epoch and dropping the {items} delivered "
        f"before the checkpoint, but this loader's reading service has in_order=False: it "
        f"delivers items as its workers finish them, so the items dropped would not be the "
        f"ones delivered (some read twice, others never). Resume this epoch with "
        f"in_order=True (the default) and switch back at the next epoch, or under the "
        f"reading service that saved the state"
    )
