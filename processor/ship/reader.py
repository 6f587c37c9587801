"""Complete records of one growing session file, from a byte position on.

A record is one line (plain JSONL) or one zstd frame (the runtime writes one
checksummed frame per append batch).  Only complete records are returned: a
last line without its newline, or a frame whose end is not on disk yet, is
left unread until it is complete (the runtime truncates a torn tail before
its next append, so it may never complete).  The reader keeps no bytes
between calls: each call opens the file, reads from ``offset`` and closes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path
from typing import Any

import orjson
import zstandard

from processor.core.errors import InvalidInput, SessionError
from processor.core.events import Event, parse_event
from processor.core.log import SessionHeader
from processor.files import (
    MAX_FILE_BYTES,
    MAX_LINE_BYTES,
    UTF8_BOM,
    ZSTD_MAGIC,
    SessionFileError,
    check_header,
    is_header_line,
)

#: bytes read from disk per step of one call
CHUNK = 1 << 20


class Unreadable(InvalidInput):
    """The file is not the runtime's format from ``offset`` on (one line says why)."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"at byte offset {offset}: {reason}")


class Shrunk(InvalidInput):
    """The file is now shorter than the position read up to (rolled back or
    repaired), or the bytes before it changed (shrunk and grown again)."""

    def __init__(self, size: int, changed: bool = False) -> None:
        self.size = size
        self.changed = changed
        super().__init__(f"file shrank to {size} bytes")


def digest(event: Event) -> bytes:
    """8 bytes naming an event's exact content (what the seq gate compares)."""
    return blake2b(event.digest_bytes(), digest_size=8).digest()


@dataclass(frozen=True, slots=True)
class Record:
    """One complete line or frame: ``[start, end)`` of the raw file and its events."""

    start: int
    end: int
    events: list[Event]
    header: SessionHeader | None = None
    #: digest of the record's bytes (the last record of a poll only)
    mark: bytes = b""


@dataclass(slots=True)
class Poll:
    records: list[Record]
    size: int
    #: an incomplete last line/frame is on disk after the records
    pending: bool
    #: the file changed while it was read: read it again
    retry: bool = False


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _lines(content: bytes, where: int) -> list[tuple[int, Any]]:
    out = []
    for line in content.split(b"\n"):
        if not line.strip():
            continue
        try:
            out.append((where, orjson.loads(line)))
        except orjson.JSONDecodeError:
            raise Unreadable(where, "a complete line is not valid JSON") from None
    return out


class TailReader:
    """Reads one file (plain or zstd) record by record from :attr:`offset`."""

    def __init__(self, path: Path, *, compressed: bool, offset: int = 0) -> None:
        self.path = path
        self.compressed = compressed
        self.offset = offset
        #: the first line was read (a header, or the file has none)
        self.started = offset > 0
        #: (start, digest) of the record just before ``offset`` (None: not known)
        self.anchor: tuple[int, bytes] | None = None

    def _values(self, start: int, end: int, content: bytes) -> Record:
        header: SessionHeader | None = None
        events: list[Event] = []
        if start == 0 and content.startswith(UTF8_BOM):
            raise Unreadable(0, "starts with a UTF-8 byte-order mark")
        for _, value in _lines(content, start):
            if not self.started:
                self.started = True
                if is_header_line(value):
                    try:
                        header = check_header(value)
                    except SessionFileError as exc:
                        raise Unreadable(start, str(exc)) from None
                    continue
            try:
                events.append(parse_event(value, trusted_json=True))
            except SessionError as exc:
                raise Unreadable(start, f"not a session event: {exc}") from None
        return Record(start, end, events, header)

    def poll(self, max_bytes: int = 4 * CHUNK) -> Poll:
        """The complete records after :attr:`offset` (about ``max_bytes`` of them).

        Does not move :attr:`offset`: the caller does, to the end of the last
        record it handled.  Raises :class:`Shrunk` or :class:`Unreadable`.
        """
        with open(self.path, "rb") as f:
            before = os.fstat(f.fileno())
            size = before.st_size
            if size < self.offset:
                raise Shrunk(size)
            if self.anchor is not None:
                start, mark = self.anchor
                f.seek(start)
                if blake2b(f.read(self.offset - start), digest_size=16).digest() != mark:
                    raise Shrunk(size, changed=True)
            f.seek(self.offset)
            try:
                if self.compressed:
                    poll, raw = self._frames(f, size, max_bytes)
                else:
                    poll, raw = self._plain(f, size, max_bytes)
            except Unreadable:
                if _identity(os.stat(self.path)) != _identity(before):
                    return Poll([], size, True, retry=True)  # changed while read
                raise
            if poll.records:
                # a read racing a truncation can mix old and new bytes: the bytes
                # parsed must still be the file's (appends after them are fine)
                f.seek(self.offset)
                if f.read(len(raw)) != raw:
                    return Poll([], size, True, retry=True)
                last = poll.records[-1]
                body = raw[last.start - self.offset : last.end - self.offset]
                mark = blake2b(body, digest_size=16).digest()
                poll.records[-1] = Record(last.start, last.end, last.events, last.header, mark)
            return poll

    def _plain(self, f: Any, size: int, max_bytes: int) -> tuple[Poll, bytes]:
        data = f.read(min(size - self.offset, max(max_bytes, CHUNK)))
        last = data.rfind(b"\n")
        if last < 0 and len(data) < size - self.offset:
            # one line longer than a read: read it whole, up to the line limit
            data += f.read(min(size - self.offset - len(data), MAX_LINE_BYTES + 1 - len(data)))
            last = data.rfind(b"\n")
        if last < 0:
            if len(data) > MAX_LINE_BYTES:
                raise Unreadable(self.offset, f"a line over the {MAX_LINE_BYTES}-byte limit")
            return Poll([], size, bool(data)), b""
        records = []
        pos = 0
        started = self.started
        try:
            while pos <= last:
                nl = data.index(b"\n", pos)
                if nl - pos > MAX_LINE_BYTES:
                    raise Unreadable(self.offset + pos, "a line over the line limit")
                records.append(
                    self._values(self.offset + pos, self.offset + nl + 1, data[pos : nl + 1])
                )
                pos = nl + 1
        finally:
            self.started = started  # the caller decides how far it got
        pending = last + 1 < len(data) or self.offset + len(data) < size
        return Poll(records, size, pending), data[: last + 1]

    def _frames(self, f: Any, size: int, max_bytes: int) -> tuple[Poll, bytes]:
        records: list[Record] = []
        raw = bytearray()
        pos = self.offset
        rest = b""
        out_total = 0
        started = self.started
        try:
            while out_total < max_bytes:
                data = rest or f.read(CHUNK)
                if not data:
                    return Poll(records, size, False), bytes(raw)
                if not data.startswith(ZSTD_MAGIC):
                    if len(data) < 4 and ZSTD_MAGIC.startswith(data):
                        return Poll(records, size, True), bytes(raw)  # a frame's first bytes
                    raise Unreadable(pos, "not a zstd frame")
                dobj = zstandard.ZstdDecompressor().decompressobj()
                out = bytearray()
                fed = 0
                frame = bytearray()
                while True:
                    frame += data
                    try:
                        out += dobj.decompress(data)
                    except zstandard.ZstdError as exc:
                        raise Unreadable(pos, f"corrupt zstd frame: {exc}") from None
                    fed += len(data)
                    if len(out) > MAX_FILE_BYTES:
                        raise Unreadable(pos, f"a frame over {MAX_FILE_BYTES} bytes")
                    if dobj.eof:
                        rest = dobj.unused_data
                        break
                    data = f.read(CHUNK)
                    if not data:
                        return Poll(records, size, True), bytes(raw)  # torn or being written
                end = pos + fed - len(rest)
                raw += frame[: len(frame) - len(rest)]
                if out and not out.endswith(b"\n"):
                    raise Unreadable(pos, "a complete zstd frame ends inside a line")
                records.append(self._values(pos, end, bytes(out)))
                out_total += len(out)
                pos = end
            return Poll(records, size, pos < size), bytes(raw)
        finally:
            self.started = started

    def advance(self, record: Record) -> None:
        """Mark ``record`` (and everything before it) handled."""
        self.offset = record.end
        self.anchor = (record.start, record.mark) if record.mark else None
        self.started = True

    def header(self) -> tuple[SessionHeader | None, bool]:
        """The header of the file (None when it has none) and whether the first
        record is complete yet; reads from byte 0 and leaves :attr:`offset` alone."""
        probe = TailReader(self.path, compressed=self.compressed)
        poll = probe.poll(max_bytes=1)
        if not poll.records:
            return None, False
        return poll.records[0].header, True
