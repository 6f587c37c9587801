"""Operator command semantics: what a control record means (pure, no Kafka).

A command is a small JSON object, addressed to a session *and a seq*::

    {"v": 1, "command": "redrive", "sessionId": "s-1", "seq": 41}

``redrive`` at seq N lifts a quarantine taken at seq N (the ``seq`` of the
session's ``status`` view).  Because it names the seq, ordering against the
events does not matter: a command read before the processor reaches that
quarantine is kept (``redrive_at``, stored in the session's checkpoint) and
lifts the quarantine when it happens; a command for a seq the session has
moved past is a counted no-op.  Applying a command twice changes nothing
more than applying it once: a repeat of the command that lifted a
quarantine, read while the session still stands at that seq, is a no-op
(``lifted_at``), not a redrive held for the next quarantine there.  How
commands travel (their own topic, offsets in the batch's transaction) is
``service/control.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson

from processor.core.errors import InvalidInput
from processor.protocol import CONTROL_VERSION

log = logging.getLogger(__name__)

COMMANDS: Final = frozenset({"redrive"})
MAX_COMMAND_BYTES: Final = 4096
_FIELDS: Final = frozenset({"v", "command", "sessionId", "seq"})
_SAFE_INT: Final = 2**53 - 1


def _murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's default partitioner, librdkafka's
    ``murmur2_random`` for non-null keys)."""
    m, r, mask = 0x5BD1E995, 24, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    end = length - length % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail = length % 4
    if tail >= 3:
        h ^= data[end + 2] << 16
    if tail >= 2:
        h ^= data[end + 1] << 8
    if tail >= 1:
        h ^= data[end]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def partition_of(key: bytes, partitions: int) -> int:
    """The partition the Java partitioner (and ours) gives a key."""
    return (_murmur2(key) & 0x7FFFFFFF) % partitions


class CommandError(InvalidInput, ValueError):
    """A control record that is not a valid command (dead-lettered, rule CONTROL)."""


@dataclass(frozen=True)
class Command:
    name: str
    session_id: str
    seq: int

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "v": CONTROL_VERSION,
                "command": self.name,
                "sessionId": self.session_id,
                "seq": self.seq,
            }
        )


def redrive(session_id: str, seq: int) -> Command:
    return Command("redrive", session_id, seq)


def parse_command(key: bytes | None, value: bytes | None) -> Command:
    """Validate a control record, bounded before it is interpreted."""
    if value is None:
        raise CommandError("control record has no value")
    if len(value) > MAX_COMMAND_BYTES:
        raise CommandError(f"control record of {len(value)} bytes (limit {MAX_COMMAND_BYTES})")
    try:
        raw: Any = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise CommandError(f"control record is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise CommandError("control record must be a JSON object")
    extra = sorted(set(raw) - _FIELDS)
    if extra:
        raise CommandError(f"unknown field(s) {', '.join(extra)}")
    if raw.get("v") != CONTROL_VERSION:
        raise CommandError(f"unsupported version {raw.get('v')!r} (expected {CONTROL_VERSION})")
    name, sid, seq = raw.get("command"), raw.get("sessionId"), raw.get("seq")
    if not isinstance(name, str) or name not in COMMANDS:
        raise CommandError(f"unknown command {name!r} (known: {', '.join(sorted(COMMANDS))})")
    if not isinstance(sid, str) or not sid:
        raise CommandError("sessionId must be a non-empty string")
    if type(seq) is not int or not 0 <= seq <= _SAFE_INT:
        raise CommandError(f"seq must be an integer in [0, 2^53-1], got {seq!r}")
    if key is None or key != sid.encode():
        raise CommandError(
            f"record key {key!r} does not match sessionId {sid!r} (the key "
            "routes the command to the session's partition)"
        )
    return Command(name, sid, seq)


class _Target(Protocol):
    """What a command acts on (``state.SessionRuntime``)."""

    session_id: str
    quarantine: Any
    redrive_at: int | None
    lifted_at: int | None

    @property
    def last_seq(self) -> int: ...


def apply_command(rt: _Target, command: Command) -> str:
    """Apply a redrive to a session: ``"lifted"``, ``"pending"`` or ``"noop"``."""
    q = rt.quarantine
    if q is not None and q.seq == command.seq:
        log.info("re-driving session %s (quarantined at seq %d)", rt.session_id, q.seq)
        rt.quarantine = None
        rt.lifted_at = q.seq
        return "lifted"
    repeat = q is None and rt.lifted_at == command.seq == rt.last_seq
    if not repeat and rt.last_seq <= command.seq and (q is None or q.seq < command.seq):
        # not there yet (a restore or replay is behind): lift it when it happens
        rt.redrive_at = command.seq
        return "pending"
    log.info(
        "redrive of %s at seq %d: nothing to do (last seq %d, %s)",
        rt.session_id,
        command.seq,
        rt.last_seq,
        f"quarantined at {q.seq}" if q else "not quarantined",
    )
    return "noop"


def misrouted(command: Command, partition: int, partition_count: int) -> str | None:
    """Why a command does not sit where its session's events do, or None."""
    if not partition_count:
        return None  # partition count not known yet: nothing to check against
    want = partition_of(command.session_id.encode(), partition_count)
    if want == partition:
        return None
    return (
        f"command for {command.session_id!r} in control partition {partition}, but its "
        f"key hashes to {want} (produce commands with the murmur2 partitioner)"
    )
