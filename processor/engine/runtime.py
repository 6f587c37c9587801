"""Per-session runtime state of the service around a core :class:`Session`.

What the core does not know about: the seq gate's duplicate window, the
quarantine, where in the events topic the last folded event sits (the
anchor), and which views were already published (only changes are
published, one record per session and view per batch).

Views a session publishes: every wire unit of the domain projections under
its key (``stateVersion`` = the unit's version), and the core views
(messages, surface, transcript, status) in parts (view_parts.py), which the
readers assemble into whole views.  ``view_ledger`` and ``part_ledger`` are
what the two topics hold, so a batch writes only what changed.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any, Final

from processor.core.events import Event
from processor.core.session import Session
from processor.core.sharing import NewestTable
from processor.engine.checkpoint_parts import PartLedger
from processor.engine.view_parts import ViewLedger
from processor.protocol import SERVICE_STATE_VERSION

#: The last tuple of published units made (see ``SessionRuntime._units``): one
#: entry, so sessions of the same units share it and it holds nothing stale.
_UNITS: Final[NewestTable[tuple[str, ...], tuple[str, ...]]] = NewestTable("published_units", 1)


#: an empty blake2b with the digest's parameters: a copy of it per event skips
#: the constructor's keyword parsing and parameter block (~1.2k of the ~9k
#: instructions of a hash, figure 1); the same digest
_DIGEST_SEED: Final = blake2b(digest_size=16)


def _short_digest(event: Event) -> bytes:
    """The first 8 bytes of ``core.session.event_digest`` (the same blake2b without
    its hex round trip: one per folded event; tests/engine/test_gate.py checks)."""
    h = _DIGEST_SEED.copy()
    h.update(event.digest_bytes())
    return h.digest()[:8]


@dataclass(frozen=True, slots=True)
class Quarantine:
    seq: int
    rule: str
    reason: str
    offset: int

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "rule": self.rule, "reason": self.reason, "offset": self.offset}


class ViewChange:
    """A unit view to publish (``SessionRuntime.view_changes``; read, never changed).

    A plain class with its own ``__init__``, not a dataclass: in the compiled
    build a dataclass's generated ``__init__`` runs interpreted (~0.7 us), one
    per changed unit view and batch; this one compiles.
    """

    __slots__ = ("name", "removed", "state_version", "value")

    def __init__(self, name: str, state_version: int, value: Any, removed: bool = False) -> None:
        self.name = name
        self.state_version = state_version
        self.value = value  # may be JSON null: a unit's view can legitimately be None
        self.removed = removed  # the view disappeared (its unit was unregistered): tombstone

    def __repr__(self) -> str:
        return (
            f"ViewChange(name={self.name!r}, state_version={self.state_version!r}, "
            f"value={self.value!r}, removed={self.removed!r})"
        )


class SessionRuntime:
    """A session as the service holds it; see the module docstring."""

    __slots__ = (
        "_digests",
        "_overrides",
        "_published_transcript",
        "_synced",
        "_units",
        "_window",
        "held_bytes",
        "last_offset",
        "last_used",
        "lifted_at",
        "part_ledger",
        "partition",
        "quarantine",
        "redrive_at",
        "session",
        "session_id",
        "view_ledger",
    )

    def __init__(
        self, session_id: str, partition: int, session: Session, *, window: int = 256
    ) -> None:
        self.session_id = session_id
        self.partition = partition
        self.session = session
        self.quarantine: Quarantine | None = None
        #: seq of a redrive command read before its quarantine happened (control.py)
        self.redrive_at: int | None = None
        #: seq of the quarantine the last redrive lifted: a repeat of that command
        #: is a no-op, not a redrive held for a future quarantine (commands.py)
        self.lifted_at: int | None = None
        self.last_offset = -1
        #: estimated resident bytes and last use (held.py: the memory budget)
        self.held_bytes = 0
        self.last_used = 0.0
        self._window = window
        # 8-byte digests of the last ``window`` folded events (contiguous seqs
        # ending at last_seq), enough to tell a retry from a conflicting rewrite;
        # one flat buffer, not a deque of bytes objects: a deque's first block
        # alone is ~0.5 KB per held session (figure 6)
        self._digests = bytearray()
        #: the unit views published, in first-publication order (so a unit that
        #: is unregistered gets its tombstone): one tuple shared by the sessions
        #: of the same units, not a dict per session (figure 6)
        self._units: tuple[str, ...] = ()
        #: transcript entries a format-1 checkpoint says were published
        self._published_transcript: int | None = None
        #: node seq -> (generation first seen at, override); None while there are
        #: none (most sessions: an empty dict is 64 bytes of each, figure 6)
        self._overrides: dict[int, tuple[int, Any]] | None = None
        #: registry generation ``_units`` last followed (-1: never): while it
        #: holds, no unit was added or released, so there is nothing to tombstone
        self._synced = -1
        #: what the views and checkpoints topics hold for this session (parted format)
        self.view_ledger = ViewLedger()
        self.part_ledger = PartLedger()

    @property
    def last_seq(self) -> int:
        return self.session.last_seq

    # ------------------------------------------------------------ seq gate

    def record_applied(self, event: Event, offset: int) -> None:
        """Remember a folded event.  (Not through ``Session.last_digest``: that one
        is the hex the checkpoint's anchor needs once per batch, left lazy.)"""
        self._push_digest(_short_digest(event))
        self.last_offset = offset

    def _push_digest(self, digest: bytes) -> None:
        buf = self._digests
        buf += digest
        if len(buf) > 8 * self._window:
            del buf[:8]  # O(1): a bytearray drops its head by moving its start

    def duplicate_verdict(self, event: Event) -> str:
        """``"same"``, ``"different"`` or ``"unknown"`` for an already-folded seq.

        ``"unknown"``: older than the window, so it cannot be proven equal.
        """
        index = len(self._digests) // 8 - 1 - (self.last_seq - event.seq)
        if index < 0:
            return "unknown"
        same = self._digests[8 * index : 8 * index + 8] == _short_digest(event)
        return "same" if same else "different"

    # ------------------------------------------------------------ views

    def view_changes(self, page_size: int = 0) -> Iterator[ViewChange]:
        """Unit views whose value changed since the last call (coalesced).

        The core views (messages, surface, transcript, status) are written in
        parts (view_parts.py); ``page_size`` is unused and kept for callers.
        """
        session = self.session
        registry = session.projections.registry
        for key, (view, _seq) in session.projections.drain_view_changes().items():
            defn = registry.get(key)
            yield ViewChange(key, defn.state_version if defn is not None else 0, view)
        generation = registry.generation
        if generation == self._synced:
            return  # the same unit keys as at the last call: none removed, none new
        units = self._units
        if any(registry.get(k) is None for k in units):
            for key in units:
                if registry.get(key) is None:
                    yield ViewChange(key, 0, None, removed=True)
            units = tuple(k for k in units if registry.get(k) is not None)
        new = [k for k in session.projections.wire_keys() if k not in units]
        if new or units is not self._units:
            units = (*units, *new)
            self._units = _UNITS.get(units, units)
        self._synced = generation

    def override_generations(self) -> dict[int, int]:
        """Node seq -> the ``contentGeneration`` its current override was first seen at.

        Both topics key an override by it, so a superseded override is a
        different record (tombstoned) and an unchanged one is never rewritten.
        """
        overrides = self.session.surface.state.overrides
        known = self._overrides
        if not overrides:  # most sessions: no dict held, none built
            self._overrides = None
            return {}
        if known is None:
            known = self._overrides = {}
        for seq, message in overrides.items():
            seen = known.get(seq)
            if seen is None or seen[1] is not message:
                known[seq] = (self.session.surface.state.content_generation, message)
        for seq in [s for s in known if s not in overrides]:
            del known[seq]
        return {seq: generation for seq, (generation, _) in known.items()}

    def adopt_override_generations(self, generations: Mapping[int, int]) -> None:
        """After a restore: the generations the restored overrides were written at."""
        overrides = self.session.surface.state.overrides
        known = {s: (g, overrides[s]) for s, g in generations.items() if s in overrides}
        self._overrides = known or None

    @property
    def published_transcript(self) -> int:
        """Transcript entries a format-1 checkpoint says were published."""
        t = self._published_transcript
        return self.session.transcript_base if t is None else t

    @property
    def digests(self) -> list[bytes]:
        """8-byte digests of the last folded events (contiguous, ending at last_seq)."""
        buf = self._digests
        return [bytes(buf[i : i + 8]) for i in range(0, len(buf), 8)]

    @property
    def digest_blob(self) -> bytes:
        """:attr:`digests` as one string of 8-byte digests."""
        return bytes(self._digests)

    @property
    def window(self) -> int:
        return self._window

    def status(self) -> dict[str, Any]:
        if self.quarantine is None:
            return {"state": "ok", "lastSeq": self.last_seq}
        return {
            "state": "quarantined",
            "lastSeq": self.last_seq,
            "quarantine": self.quarantine.to_json(),
        }

    # ------------------------------------------------------------ checkpoint

    def service_state(self) -> dict[str, Any]:
        """What the checkpoint stores besides the core session checkpoint."""
        digests = bytes(self._digests)
        return {
            "version": SERVICE_STATE_VERSION,
            "lastOffset": self.last_offset,
            "quarantine": self.quarantine.to_json() if self.quarantine else None,
            "redriveAt": self.redrive_at,
            "liftedAt": self.lifted_at,
            "digests": base64.b64encode(digests).decode(),
            "published": {}
            if self._published_transcript is None
            else {"transcript": self._published_transcript},
        }

    def load_service_state(self, raw: Mapping[str, Any]) -> None:
        self.last_offset = int(raw.get("lastOffset", -1))
        q = raw.get("quarantine")
        self.quarantine = Quarantine(q["seq"], q["rule"], q["reason"], q["offset"]) if q else None
        redrive_at = raw.get("redriveAt")
        self.redrive_at = int(redrive_at) if redrive_at is not None else None
        lifted_at = raw.get("liftedAt")  # absent in checkpoints written before it existed
        self.lifted_at = int(lifted_at) if lifted_at is not None else None
        blob = base64.b64decode(raw.get("digests", ""))
        for i in range(0, len(blob) - len(blob) % 8, 8):
            self._push_digest(blob[i : i + 8])
        published = raw.get("published") or {}
        if "transcript" in published:
            self._published_transcript = int(published["transcript"])
        # Everything else is republished once after a restore: harmless,
        # the values are identical and asOfSeq does not go back.
