"""The wire protocol's names and versions, in one place.

What a subscriber in another language must know besides the Avro schemas
(``schemas/``): the topics of a prefix, the view names (the core's four,
transcript pages, then one per domain unit), the versions stamped on
records and commands.  The encoders and decoders (``processor/codec``), the
engine and the readers import these names; none of them spells one itself.
"""

from __future__ import annotations

from typing import Final

from processor.core.projection_registry import (
    CORE_VIEWS,
    INTERNAL_VIEW_PREFIX,
    TRANSCRIPT_PAGE_PREFIX,
)
from processor.core.session import CHECKPOINT_VERSION

__all__ = [
    "CHECKPOINT_VERSION",
    "CHUNK_ITEMS",
    "CONTROL_HEADER",
    "CONTROL_VERSION",
    "CORE_STATE_VERSION",
    "CORE_VIEWS",
    "DIGEST_BLOCK",
    "SERVICE_STATE_VERSION",
    "TOPIC_SUFFIXES",
    "VIEWS_FORMAT",
    "VIEW_HEAD",
    "bundle_view",
    "content_view",
    "is_internal_view",
    "is_transcript_page",
    "node_chunk_view",
    "transcript_chunk_view",
    "transcript_page",
]

# The parted format (format 2, issue 12): names of the views topic's records
# besides the domain units; docs/views-format.md (the normative spec) says
# how a reader assembles them.

#: Items per closed chunk of a list (node refs, transcript seqs, checkpoint lists).
CHUNK_ITEMS: Final = 16
#: Digests per closed block of the checkpoint's duplicate window (the open
#: block rides in every head: 8 halves it against 16 for one more small part
#: per 8 events; a head names its block size, version-1 heads used 16).
DIGEST_BLOCK: Final = 8
#: One per session, rewritten per batch: status, generations, chunk versions, tails.
VIEW_HEAD: Final = "~h"
#: ``f`` of a views head: 3 = messages in bundles ``~b<n>`` (format 2 wrote
#: ``~m<seq>`` records only and its heads carry no ``f``).
VIEWS_FORMAT: Final = 3
_INTERNAL: Final = INTERNAL_VIEW_PREFIX


def content_view(seq: int, generation: int | None = None) -> str:
    """The record holding the message of ``seq`` (an override at ``generation``)."""
    return f"~m{seq}" if generation is None else f"~m{seq}.{generation}"


def bundle_view(number: int) -> str:
    """Bundle ``number`` of a session: the messages one transaction published."""
    return f"~b{number}"


def node_chunk_view(index: int) -> str:
    """Closed chunk ``index`` of the head's node refs (rewritten, versioned)."""
    return f"~n{index}"


def transcript_chunk_view(index: int) -> str:
    """Closed chunk ``index`` of the transcript's seqs (written once)."""
    return f"~t{index}"


def is_internal_view(view: str) -> bool:
    """A record of the parted format, not a view a subscriber shows as such."""
    return view.startswith(_INTERNAL)


#: ``<prefix>.<suffix>``: events in, views and checkpoints (compacted) and
#: dead letters out, operator commands in.
TOPIC_SUFFIXES: Final = ("events", "views", "checkpoints", "dlq", "control")

#: ``CORE_VIEWS``: views every session has; domain units add one view each
#: under their key, which registration refuses when reserved (P-2,
#: ``processor.core.projection_registry.reserved_key_reason``).

#: ``stateVersion`` of the core views (they are not domain units).
CORE_STATE_VERSION: Final = -1

_PAGE_PREFIX: Final = TRANSCRIPT_PAGE_PREFIX


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
