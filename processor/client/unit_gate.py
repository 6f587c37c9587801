"""Unit views gated by heads (docs/views-format.md, section 6).

A batch writes a session's unit records before its head ``~h``.  A reader
that shows each record as it comes would show a unit at seq N+1 beside a
``status`` still at N until the head arrives.  So once a session has a head,
its unit records (and unit tombstones) are held here and applied when its
next head arrives; the head is the last record of the session in every
transaction, so what is held is at most one transaction's records, one per
key.  A session without a head yet (its first batch, or a format-1 writer)
is not gated: there is nothing to be inconsistent with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from processor.codec import View


@dataclass
class UnitGate:
    #: sessions whose unit records wait for their next head
    gated: set[str] = field(default_factory=set)
    #: session -> key -> the record (None: a tombstone), in write order
    held: dict[str, dict[bytes, View | None]] = field(default_factory=dict)

    def hold(self, session_id: str, key: bytes, record: View | None) -> bool:
        """Keep ``record`` for the session's next head; False when not gated."""
        if session_id not in self.gated:
            return False
        records = self.held.setdefault(session_id, {})
        records.pop(key, None)  # the newest record of a key, at its place in order
        records[key] = record
        return True

    def release(self, session_id: str) -> list[tuple[bytes, View | None]]:
        """At a head of the session: what it held, in order; gated from now on."""
        self.gated.add(session_id)
        return list(self.held.pop(session_id, {}).items())

    def reset(self, session_id: str) -> list[tuple[bytes, View | None]]:
        """At a tombstone on the session's head: what it held; not gated any more."""
        self.gated.discard(session_id)
        return list(self.held.pop(session_id, {}).items())

    def held_records(self) -> int:
        return sum(len(r) for r in self.held.values())


def key_session(key: bytes) -> str | None:
    """The session of a views key: everything before its last ``/`` (section 3)."""
    sid, sep, _ = key.rpartition(b"/")
    if not sep:
        return None
    try:
        return sid.decode()
    except UnicodeDecodeError:
        return None
