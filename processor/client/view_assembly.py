"""Whole core views out of the parted views records (format 2, issue 12).

The writer (engine/view_parts.py) publishes per session a head ``~h`` plus
bundles ``~b<n>`` of messages (format 3; format 2 wrote each message as
its own record ``~m<seq>[.<generation>]``, still read), node chunks
``~n<i>`` and transcript chunks ``~t<i>``.  :class:`PartedViews` keeps the newest record
of each (tombstones remove them) and, when a head arrives, assembles the
session's ``messages``, ``surface``, ``status``, ``transcript`` index and
``transcript.<n>`` pages — exactly the values format 1 published whole.

Consistency rule: a head is assembled only when every record it names is
held, a node chunk at the version (``asOfSeq``) the head names.  A head that
is missing one (a reader starting mid-history of a compacted topic, whose
older versions are gone) is skipped; a later head will be complete, since
the writer commits the records a head names in the head's transaction.
A message is named by its seq (and override generation): the reader finds
it in its own record or in any held bundle listing it (an entry's content
never changes, so every bundle listing it holds the same message).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from processor.codec import CodecError, View
from processor.core.errors import InvalidInput
from processor.protocol import (
    CHUNK_ITEMS,
    VIEW_HEAD,
    VIEWS_FORMAT,
    bundle_view,
    content_view,
    node_chunk_view,
    transcript_chunk_view,
    transcript_page,
)

log = logging.getLogger(__name__)
BUNDLE_PREFIX = bundle_view(0)[:-1]


class Incomplete(InvalidInput):
    """A head names a record the reader does not hold (at that version)."""


#: Default bound of the decoded-content cache of one reader (bytes of the
#: encoded records whose decoded values it holds).
DECODED_CACHE_BYTES = 64 << 20


class DecodedCache:
    """Decoded values of parted records, least recently used evicted first.

    Assembling a head decodes every message of the surface; keeping them
    decoded saves that work per head, but without a bound the cache grows
    with the whole topic (next to the encoded records the reader must hold
    anyway).  The bound counts the encoded size of the records held decoded;
    an evicted value is decoded again from its record when a head needs it.
    Hitting the bound is logged once and counted in ``evictions``.
    """

    def __init__(self, max_bytes: int = DECODED_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"decoded cache bound must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evictions = 0
        self._values: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: tuple[str, str], record: View) -> Any:
        hit = self._values.get(key)
        if hit is not None:
            self._values.move_to_end(key)
            return hit[0]
        value = record.json_value()
        cost = len(record.value)
        self._values[key] = (value, cost)
        self.bytes += cost
        while self.bytes > self.max_bytes and self._values:
            _, (_, old) = self._values.popitem(last=False)
            self.bytes -= old
            if not self.evictions:
                log.warning(
                    "views reader: decoded cache reached its bound of %d bytes; evicting "
                    "least recently used values (decoded again when needed)",
                    self.max_bytes,
                )
            self.evictions += 1
        return value

    def drop(self, key: tuple[str, str]) -> None:
        hit = self._values.pop(key, None)
        if hit is not None:
            self.bytes -= hit[1]


@dataclass
class SessionParts:
    """The newest parted records of one session, and what was assembled last."""

    session_id: str
    cache: DecodedCache
    records: dict[str, View] = field(default_factory=dict)
    total: int | None = None  # transcript total of the last assembled head
    as_of: int | None = None  # asOfSeq of the last assembled head
    skipped: int = 0  # heads not assembled for want of a record
    #: message name (``~m<seq>[.<g>]``) -> (bundle holding it, position)
    index: dict[str, tuple[str, int]] = field(default_factory=dict)
    members: dict[str, list[str]] = field(default_factory=dict)  # bundle -> its names

    def put(self, view: View) -> None:
        self.drop(view.view)
        if view.parts != 1:  # never split (docs/views-format.md, section 4): unreadable
            log.warning("views reader: %s/%s comes in parts", self.session_id, view.view)
            return  # a head naming it stays incomplete, and is counted
        self.records[view.view] = view
        if view.view.startswith(BUNDLE_PREFIX):
            self._index(view)

    def _index(self, view: View) -> None:
        """List the entries of bundle ``view`` (one that does not decode lists none:
        a head naming its messages then stays incomplete, and is counted)."""
        try:
            items = self.cache.get((self.session_id, view.view), view)
            # an entry of another length is ignored without shifting the others:
            # the index keeps each entry's position in the bundle as written
            at = [
                (content_view(int(e[0]), None if len(e) == 2 else int(e[1])), i)
                for i, e in enumerate(items)
                if len(e) in (2, 3)
            ]
        except (CodecError, TypeError, ValueError, KeyError) as exc:
            sid = self.session_id
            log.warning("views reader: unreadable bundle %s/%s: %s", sid, view.view, exc)
            return
        self.members[view.view] = [name for name, _ in at]
        for name, i in at:
            self.index[name] = (view.view, i)

    def drop(self, name: str) -> None:
        if self.records.pop(name, None) is None:
            return
        self.cache.drop((self.session_id, name))
        for entry in self.members.pop(name, ()):
            if self.index.get(entry, ("",))[0] == name:
                del self.index[entry]

    def clear(self) -> None:
        for name in self.records:
            self.cache.drop((self.session_id, name))
        self.records.clear()
        self.index.clear()
        self.members.clear()

    def value(self, name: str, version: int | None = None) -> Any:
        record = self.records.get(name)
        if record is None:
            hit = self.index.get(name)
            if hit is None or version is not None:
                raise Incomplete(name)
            bundle, position = hit
            return self.cache.get((self.session_id, bundle), self.records[bundle])[position][-1]
        if version is not None and record.as_of_seq != version:
            raise Incomplete(name)
        return self.cache.get((self.session_id, name), record)

    def has(self, name: str) -> bool:
        return name in self.records or name in self.index


def assemble(parts: SessionParts, head: View) -> dict[str, Any] | None:
    """The core views a complete ``head`` describes (changed pages only), else None.

    Pages before the page of the last assembled total are unchanged (the
    transcript only grows), so they are not rebuilt.
    """
    h: Mapping[str, Any] = head.json_value()
    if int(h.get("f", 2)) > VIEWS_FORMAT:
        log.warning("views reader: head of format %s is newer than %d", h["f"], VIEWS_FORMAT)
        parts.skipped += 1
        return None
    try:
        refs: list[Any] = []
        for i, age in enumerate(h["nc"]):
            refs.extend(parts.value(node_chunk_view(i), head.as_of_seq - age))
        refs.extend(h["nt"])
        nodes: list[int] = []
        messages: list[Any] = []
        for ref in refs:
            if isinstance(ref, int):
                nodes.append(ref)
                messages.append(parts.value(content_view(ref)))
            elif len(ref) == 2:
                nodes.append(ref[0])
                messages.append(parts.value(content_view(ref[0], ref[1])))
            else:
                nodes.append(ref[0])
        base, total, page_size = int(h.get("tb", 0)), int(h["tn"]), int(h["ps"])
        seqs: list[int] = []
        for i in range((total - base) // CHUNK_ITEMS):
            seqs.extend(parts.value(transcript_chunk_view(i)))
        seqs.extend(h["tt"])
        if len(seqs) != total - base:
            raise Incomplete(f"transcript holds {len(seqs)} of {total - base} seqs")
        for seq in seqs:
            if not parts.has(content_view(seq)):
                raise Incomplete(content_view(seq))
        previous = parts.total if parts.total is not None and parts.total <= total else 0
        first_page = max(previous, base) // page_size
        views: dict[str, Any] = {}
        for page in range(first_page, -(-total // page_size)):
            start, stop = page * page_size, min((page + 1) * page_size, total)
            views[transcript_page(page)] = [
                {"seq": s, "message": parts.value(content_view(s))}
                for s in seqs[start - base : stop - base]
            ]
    except Incomplete:
        parts.skipped += 1
        return None
    status: dict[str, Any] = {"state": "ok", "lastSeq": head.as_of_seq}
    if "q" in h:
        status = {"state": "quarantined", "lastSeq": head.as_of_seq, "quarantine": h["q"]}
    views["messages"] = messages
    views["surface"] = {
        "nodes": nodes,
        "replaceGeneration": h["rg"],
        "contentGeneration": h["cg"],
    }
    views["transcript"] = {
        "total": total,
        "pageSize": page_size,
        "pages": -(-total // page_size),
    }
    views["status"] = status
    parts.total = total
    parts.as_of = head.as_of_seq
    return views


class PartedViews:
    """The parted records of every session, by key (a tombstone has only its key)."""

    def __init__(self, cache_bytes: int = DECODED_CACHE_BYTES) -> None:
        self.sessions: dict[str, SessionParts] = {}
        self.cache = DecodedCache(cache_bytes)
        self._keys: dict[bytes, tuple[str, str]] = {}

    def put(self, key: bytes | None, view: View) -> dict[str, Any] | None:
        """Keep ``view``; for a head, the assembled views (None when incomplete)."""
        parts = self.sessions.get(view.session_id)
        if parts is None:
            parts = self.sessions[view.session_id] = SessionParts(view.session_id, self.cache)
        if key is not None:
            self._keys[key] = (view.session_id, view.view)
        parts.put(view)
        if view.view != VIEW_HEAD:
            return None
        return assemble(parts, view)

    def remove(self, key: bytes) -> tuple[str, str] | None:
        """Forget the record under ``key``: its (session, name), None if unknown.

        A head tombstone forgets the whole session (it is being rebuilt).
        """
        ident = self._keys.pop(key, None)
        if ident is None:
            return None
        sid, name = ident
        parts = self.sessions.get(sid)
        if parts is not None:
            if name == VIEW_HEAD:
                self.sessions.pop(sid).clear()
            else:
                parts.drop(name)
        return ident
