"""Record names, framing markers, limits and the codec's one error type."""

from __future__ import annotations

from typing import Final, Literal

from processor.core.errors import InvalidInput

NAMESPACE: Final = "processor.v1"
SESSION_EVENT: Final = "processor.v1.SessionEvent"
VIEW: Final = "processor.v1.View"
CHECKPOINT: Final = "processor.v1.Checkpoint"
CHECKPOINT_HEAD: Final = "processor.v1.CheckpointHead"
CHECKPOINT_PART: Final = "processor.v1.CheckpointPart"
DEAD_LETTER: Final = "processor.v1.DeadLetter"
_REPLACE_OP: Final = "processor.v1.ReplaceOp"
_OPAQUE: Final = "processor.v1.OpaqueJson"

SINGLE_OBJECT_MARKER: Final = b"\xc3\x01"
CONFLUENT_MAGIC: Final = b"\x00"
_SO_HEADER_LEN: Final = 10
_CF_HEADER_LEN: Final = 5

#: ``stateVersion`` of the core views (messages, transcript, surface, status).
#: JSON payloads larger than this many bytes are zstd-compressed.
COMPRESS_THRESHOLD: Final = 1024
ZSTD_LEVEL: Final = 3
#: Default largest view chunk (value bytes) per record; Kafka's default
#: ``max.message.bytes`` is ~1 MiB including batch overhead.
MAX_VIEW_PART_BYTES: Final = 512 * 1024

_LONG_MIN: Final = -(2**63)
_LONG_MAX: Final = 2**63 - 1
_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1

_ENVELOPE_KEYS: Final = frozenset(
    {"type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs", "ignorable"}
)

Framing = Literal["single-object", "confluent"]
ViewEncoding = Literal["JSON", "ZSTD_JSON"]
_ENCODINGS: Final = ("JSON", "ZSTD_JSON")


class CodecError(InvalidInput, ValueError):
    """Bytes that are not a valid framed record, or a value Avro cannot carry."""
