"""The wire protocol's names and versions, in one place.

What a subscriber in another language must know besides the Avro schemas
(``schemas/``): the topics of a prefix, the view names (the core's four,
transcript pages, then one per domain unit), the versions stamped on
records and commands.  The encoders and decoders (``processor/codec``), the
engine and the readers import these names; none of them spells one itself.
"""

from __future__ import annotations

from typing import Final

from processor.core.session import CHECKPOINT_VERSION

__all__ = [
    "CHECKPOINT_VERSION",
    "CONTROL_HEADER",
    "CONTROL_VERSION",
    "CORE_STATE_VERSION",
    "CORE_VIEWS",
    "SERVICE_STATE_VERSION",
    "TOPIC_SUFFIXES",
    "is_transcript_page",
    "transcript_page",
]

#: ``<prefix>.<suffix>``: events in, views and checkpoints (compacted) and
#: dead letters out, operator commands in.
TOPIC_SUFFIXES: Final = ("events", "views", "checkpoints", "dlq", "control")

#: Views every session has; domain units add one view each under their key.
CORE_VIEWS: Final = ("messages", "surface", "transcript", "status")
#: ``stateVersion`` of the core views (they are not domain units).
CORE_STATE_VERSION: Final = -1

_PAGE_PREFIX: Final = "transcript."


def transcript_page(n: int) -> str:
    """The view holding closed transcript page ``n`` (written once, never changed)."""
    return f"{_PAGE_PREFIX}{n}"


def is_transcript_page(view: str) -> bool:
    return view.startswith(_PAGE_PREFIX)


#: Version of the service part of a checkpoint (quarantine, offsets, digests).
SERVICE_STATE_VERSION: Final = 1
#: ``v`` of a control-topic command.
CONTROL_VERSION: Final = 1
#: The header that carried commands in the events topic (protocol v0).  Never
#: interpreted now; a record carrying it is dead-lettered like any other.
CONTROL_HEADER: Final = "processor-control"
