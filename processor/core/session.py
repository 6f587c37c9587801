"""Session = log + surface + derived messages + domain projections.

The one place where an event becomes part of a session: validate (plan),
then commit to the surface, the log, the transcript and every domain
projection, in that order, so a rejected event changes nothing.

A :class:`Session` can be checkpointed and restored without its log prefix:
the checkpoint holds the planner's surface state, the transcript and the
projection rows, all at one ``lastSeq``.  That is what the Kafka service
stores; the offline tools use the same code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from processor.core.errors import SessionError
from processor.core.events import Event
from processor.core.frozen import FrozenDict, freeze, frozen_dict_of
from processor.core.log import SessionHeader, SessionLog
from processor.core.message_projections import MessageProjectionRegistry
from processor.core.messages import DerivedMessages, derive_event_message
from processor.core.projections import ProjectionRegistry, SessionProjections
from processor.core.restore_share import SharedValues
from processor.core.surface import Plan, SurfaceManager, SurfaceState, assert_projections

CHECKPOINT_VERSION = 1
# compiled, a Final is a C static; the imported class name is a module-dict
# look-up at each use (twice per transcript entry)
_FROZEN_DICT: Final = FrozenDict
# a transcript entry's dict becomes the frozen entry itself (compiled: no copy)
_FROZEN_DICT_OF: Final = frozen_dict_of


def event_digest(event: Event) -> str:
    """A short content digest of an event (duplicate and anchor checks)."""
    return hashlib.blake2b(event.digest_bytes(), digest_size=16).hexdigest()


def synthetic_header(session_id: str = "unknown") -> SessionHeader:
    """The header given to a log that has no header line (§11)."""
    return {
        "type": "session",
        "version": 4,
        "id": session_id,
        "createdAt": 0,
        "isSeeded": False,
        "delegationDepth": 0,
    }


class Session:
    """One session's folded state; see the module docstring."""

    __slots__ = (
        "_derived",
        "_digest_due",
        "_last_digest",
        "_transcript",
        "_transcript_base",
        "header",
        "log",
        "projections",
        "surface",
    )

    def __init__(
        self,
        header: SessionHeader | None = None,
        *,
        message_projections: MessageProjectionRegistry | None = None,
        projections: ProjectionRegistry | None = None,
        _log: SessionLog | None = None,
        _surface: SurfaceState | None = None,
        _transcript: list[dict[str, Any]] | None = None,
        dialect: int | None = None,
    ) -> None:
        self.header: SessionHeader = header if header is not None else synthetic_header()
        self.log = _log if _log is not None else SessionLog()
        self.surface = SurfaceManager(message_projections, _surface)
        # Message rules of the file's format version (see check_message_shape).
        self.surface.state.dialect = dialect
        self._derived = DerivedMessages()
        self._last_digest: str | None = None
        # The last event whose digest nobody asked for yet: only the last
        # digest is ever read, so a fold hashes once instead of per event.
        self._digest_due: Event | None = None
        self._transcript: list[dict[str, Any]] = _transcript if _transcript is not None else []
        self._transcript_base = 0
        self.projections = SessionProjections(
            projections if projections is not None else ProjectionRegistry(),
            self.header,
            self.log,
        )

    # ------------------------------------------------------------ writing

    @property
    def next_seq(self) -> int:
        return self.surface.state.next_seq

    @property
    def last_seq(self) -> int:
        return self.surface.state.next_seq - 1

    @property
    def last_digest(self) -> str | None:
        """:func:`event_digest` of the last committed event."""
        if self._digest_due is not None:
            self._last_digest = event_digest(self._digest_due)
            self._digest_due = None
        return self._last_digest

    def validate(self, event: Event) -> Plan:
        """Plan ``event`` as the next one and stage it; changes nothing."""
        return self.surface.validate_next(event)

    def append(self, event: Event) -> Plan:
        """Validate (reusing a staged plan) and commit ``event``."""
        plan = self.surface.commit(event)
        self.log.append(event)
        self._digest_due = event
        op = event.surface_op
        # G-4: only append-origin events (transcript_entry).  The str test first:
        # compiled, a str compares as a str (length, then bytes) where an Any
        # went through the generic rich compare, and half the events carry none
        if isinstance(op, str) and op == "append":
            message = derive_event_message(event)
            if message is not None:
                # the message is part of the (frozen) event: freeze(entry) would
                # copy this one dict and reuse the message, so build it frozen
                if type(message) is not _FROZEN_DICT:
                    message = freeze(message)
                self._transcript.append(_FROZEN_DICT_OF({"seq": event.seq, "message": message}))
        self.projections.on_append(event)
        return plan

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            self.append(event)

    # ------------------------------------------------------------ reading

    def derive_messages(self) -> list[Any]:
        """The model context (G-2); fails loudly after an M-4 removal."""
        assert_projections(self.surface.state, self.surface.message_projections)
        return self._derived.derive(self.surface.state)

    def transcript(self) -> list[Any]:
        """The human history (G-4): append-origin entries ``{seq, message}``.

        Entries below :attr:`transcript_base` were handed off (the service
        publishes closed transcript pages and forgets them).
        """
        return list(self._transcript)

    @property
    def transcript_base(self) -> int:
        return self._transcript_base

    @property
    def transcript_count(self) -> int:
        return self._transcript_base + len(self._transcript)

    def transcript_slice(self, start: int, stop: int) -> list[Any]:
        """Entries ``start..stop-1`` by absolute index (must be retained)."""
        if start < self._transcript_base:
            raise ValueError(f"transcript entries below {self._transcript_base} were dropped")
        return self._transcript[start - self._transcript_base : stop - self._transcript_base]

    def drop_transcript_before(self, index: int) -> None:
        """Forget transcript entries below absolute ``index`` (already published)."""
        drop = min(max(index - self._transcript_base, 0), len(self._transcript))
        if drop:
            del self._transcript[:drop]
            self._transcript_base += drop

    def surface_view(self) -> dict[str, Any]:
        state = self.surface.state
        return {
            "nodes": list(state.nodes),
            "replaceGeneration": state.replace_generation,
            "contentGeneration": state.content_generation,
        }

    # ------------------------------------------------------------ checkpoints

    def checkpoint(self, *, detached: bool = True) -> dict[str, Any]:
        """Everything needed to continue this session after ``lastSeq``.

        Plain JSON values; the projection rows are detached copies (P-5), or
        with ``detached=False`` frozen and shared with the live states (no
        copy: for a caller that encodes the checkpoint right away).
        """
        return {
            "version": CHECKPOINT_VERSION,
            "lastSeq": self.last_seq,
            "lastDigest": self.last_digest,
            "surface": self.surface.state.to_json(),
            "transcriptBase": self._transcript_base,
            "transcript": self.transcript(),
            "rows": self.projections.checkpoint(detached=detached),
        }

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Mapping[str, Any],
        header: SessionHeader | None = None,
        *,
        message_projections: MessageProjectionRegistry | None = None,
        projections: ProjectionRegistry | None = None,
        dialect: int | None = None,
    ) -> Session:
        """Continue a session from :meth:`checkpoint` output (no log prefix).

        Every registered unit needs a usable row at ``lastSeq``; otherwise
        the prefix is required and a :class:`SessionError` says to re-read
        from seq 0 (P-7) — a stale or version-bumped row is never served.
        """
        if checkpoint.get("version") != CHECKPOINT_VERSION:
            raise SessionError(
                None,
                "P-7",
                f"unsupported checkpoint version {checkpoint.get('version')!r}; re-read from seq 0",
            )
        last_seq = int(checkpoint["lastSeq"])
        state = SurfaceState.from_json(checkpoint["surface"])
        if state.next_seq != last_seq + 1:
            raise SessionError(
                None, "P-7", "checkpoint surface and lastSeq disagree; re-read from seq 0"
            )
        session = cls(
            header,
            message_projections=message_projections,
            projections=projections,
            _log=SessionLog(base_seq=last_seq + 1),
            _surface=state,
            _transcript=[freeze(e) for e in checkpoint["transcript"]],
            dialect=dialect,
        )
        # the rows reuse the surface's frozen blocks, as a fresh fold's cells do
        shared = SharedValues([*state.node_events.values(), *state.headers.values()])
        session.projections.install(checkpoint["rows"], last_seq, shared.freeze)
        session._last_digest = checkpoint.get("lastDigest")
        session._transcript_base = int(checkpoint.get("transcriptBase", 0))
        return session

    @staticmethod
    def matches_anchor(checkpoint: Mapping[str, Any], event: Event) -> bool:
        """Is ``event`` the very event the checkpoint was taken after?"""
        return event.seq == checkpoint.get("lastSeq") and event_digest(event) == checkpoint.get(
            "lastDigest"
        )

    @classmethod
    def fold(
        cls,
        events: Sequence[Event],
        header: SessionHeader | None = None,
        *,
        message_projections: MessageProjectionRegistry | None = None,
        projections: ProjectionRegistry | None = None,
        dialect: int | None = None,
    ) -> Session:
        """Fold a whole log offline through the same path as live appends."""
        session = cls(
            header,
            message_projections=message_projections,
            projections=projections,
            dialect=dialect,
        )
        session.extend(events)
        return session
