"""Typed records (event, view, checkpoint, dead letter), keys, and view parts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from processor.codec.names import (
    COMPRESS_THRESHOLD,
    MAX_VIEW_PART_BYTES,
    CodecError,
    ViewEncoding,
)
from processor.codec.payload import (
    decode_json_payload,
    encode_json_payload,
)


@dataclass(frozen=True, slots=True)
class View:
    """One ``View`` record (or one part of a split view).

    ``value`` holds the encoded payload bytes (per ``encoding``); build from a
    JSON value with :meth:`of`, read it back with :meth:`json_value`.
    """

    session_id: str
    view: str
    as_of_seq: int
    state_version: int
    encoding: ViewEncoding
    value: bytes
    part: int = 0
    parts: int = 1

    @classmethod
    def of(
        cls,
        session_id: str,
        view: str,
        as_of_seq: int,
        state_version: int,
        value: Any,
        *,
        threshold: int = COMPRESS_THRESHOLD,
    ) -> View:
        encoding, payload = encode_json_payload(value, threshold=threshold)
        return cls(session_id, view, as_of_seq, state_version, encoding, payload)

    @property
    def key(self) -> bytes:
        """The record key: ``<session>/<view>``, or ``...#<part>`` for part >= 1."""
        return view_key(self.session_id, self.view, self.part)

    def json_value(self) -> Any:
        """The decoded view value (only for a whole view: ``parts == 1``)."""
        if self.parts != 1:
            raise CodecError(
                f"view {self.session_id}/{self.view} is part {self.part} of {self.parts}; "
                "reassemble it first (join_view_parts / ViewAssembler)"
            )
        return decode_json_payload(self.encoding, self.value)


@dataclass(frozen=True, slots=True)
class Anchor:
    """Events-topic position and digest of a checkpoint's last folded event."""

    partition: int
    offset: int
    seq: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Per-session state: projection ``rows`` ``{key: {ver, seq, val}}`` and the
    core ``surface`` state (both JSON values), the watermark and its anchor."""

    session_id: str
    last_seq: int
    anchor: Anchor
    rows: Mapping[str, Any]
    surface: Any
    core_version: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A refused record with its origin, the refusing rule, and its raw bytes."""

    session_id: str | None
    topic: str
    partition: int
    offset: int
    seq: int | None
    rule: str
    reason: str
    key: bytes | None
    value: bytes | None
    timestamp: int
    processor: str


def session_key(session_id: str) -> bytes:
    """Record key of events and checkpoints: the UTF-8 session id."""
    return session_id.encode()


def view_key(session_id: str, view: str, part: int = 0) -> bytes:
    """``<session>/<view>`` for a view (head), ``<session>/<view>#<part>`` for parts >= 1."""
    if part == 0:
        return f"{session_id}/{view}".encode()
    return f"{session_id}/{view}#{part}".encode()


def stale_part_keys(session_id: str, view: str, old_parts: int, new_parts: int) -> list[bytes]:
    """Part keys to tombstone when a view goes from ``old_parts`` to ``new_parts``.

    ``new_parts == 0`` means the view disappeared (the head key is included).
    """
    start = max(new_parts, 0)
    return [view_key(session_id, view, i) for i in range(start, old_parts)]


def split_view(view: View, max_part_bytes: int = MAX_VIEW_PART_BYTES) -> list[View]:
    """Cut a whole view into parts of at most ``max_part_bytes`` value bytes."""
    if view.parts != 1:
        raise CodecError("split_view needs a whole view (parts == 1)")
    if max_part_bytes <= 0:
        raise ValueError("max_part_bytes must be positive")
    value = view.value
    if len(value) <= max_part_bytes:
        return [view]
    chunks = [value[i : i + max_part_bytes] for i in range(0, len(value), max_part_bytes)]
    n = len(chunks)
    return [replace(view, value=chunk, part=i, parts=n) for i, chunk in enumerate(chunks)]


def join_view_parts(parts: Iterable[View]) -> View:
    """Reassemble the parts of one split view (any order) into a whole view."""
    items = sorted(parts, key=lambda v: v.part)
    if not items:
        raise CodecError("no view parts to join")
    head = items[0]
    n = head.parts
    same = (head.session_id, head.view, head.as_of_seq, head.state_version, head.encoding, n)
    for item in items:
        if (
            item.session_id,
            item.view,
            item.as_of_seq,
            item.state_version,
            item.encoding,
            item.parts,
        ) != same:
            raise CodecError(
                f"view parts of {head.session_id}/{head.view} disagree "
                f"(asOfSeq/stateVersion/encoding/parts)"
            )
    if [v.part for v in items] != list(range(n)):
        raise CodecError(
            f"view {head.session_id}/{head.view}@{head.as_of_seq} needs parts 0..{n - 1}, "
            f"got {[v.part for v in items]}"
        )
    if n == 1:
        return head
    return replace(head, value=b"".join(v.value for v in items), part=0, parts=1)


class ViewAssembler:
    """Reader-side reassembly of split views.

    :meth:`add` each decoded ``View`` in consumption order; it returns the
    whole view when one is complete (immediately for unsplit views), else
    ``None``.  Parts older (smaller ``asOfSeq``) than the newest version seen
    for that (session, view) are ignored; a newer version drops the pending
    parts of an older one.
    """

    def __init__(self) -> None:
        self._pending: dict[tuple[str, str], tuple[int, int, dict[int, View]]] = {}
        self._latest: dict[tuple[str, str], int] = {}

    def add(self, view: View) -> View | None:
        ident = (view.session_id, view.view)
        latest = self._latest.get(ident)
        if latest is not None and view.as_of_seq < latest:
            return None
        self._latest[ident] = view.as_of_seq
        if view.parts == 1:
            self._pending.pop(ident, None)
            return view
        pending = self._pending.get(ident)
        if pending is None or pending[0] != view.as_of_seq or pending[1] != view.parts:
            pending = (view.as_of_seq, view.parts, {})
            self._pending[ident] = pending
        got = pending[2]
        got[view.part] = view
        if len(got) < view.parts:
            return None
        del self._pending[ident]
        return join_view_parts(got.values())

    def forget(self, session_id: str, view: str) -> None:
        """Drop state for a view (after its head tombstone)."""
        self._pending.pop((session_id, view), None)
        self._latest.pop((session_id, view), None)

    @property
    def pending(self) -> int:
        return len(self._pending)
