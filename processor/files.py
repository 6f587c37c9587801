"""Session files written by the agent harness (SESSION-SEMANTICS §11).

JSON Lines: an optional header line ``{"type": "session", ...}`` then one
event envelope per line in seq order; plain or zstd-compressed (``.zst`` /
``.zstd``, or recognised by the zstd magic bytes).  A crashed writer can leave
a torn last line: it is reported with its byte offset and refused unless the
caller explicitly drops it.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import zstandard

from processor.core.events import Event, parse_event
from processor.core.log import SessionHeader
from processor.core.session import synthetic_header

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SUPPORTED_VERSIONS = frozenset({0, 1})
HEADER_REQUIRED = frozenset({"type", "version", "id", "createdAt", "isSeeded", "delegationDepth"})
HEADER_OPTIONAL = frozenset({"cwd", "parentSession", "origin", "agentPreset"})


class SessionFileError(ValueError):
    """The file itself is unusable (bad header, torn tail, unsupported format)."""


@dataclass(frozen=True, slots=True)
class TornTail:
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class SessionFile:
    header: SessionHeader
    events: list[Event]
    has_header: bool
    torn_tail: TornTail | None = None


def read_bytes(path: str | Path) -> bytes:
    """The decompressed content of a session file."""
    raw = Path(path).read_bytes()
    if raw.startswith(ZSTD_MAGIC) or str(path).endswith((".zst", ".zstd")):
        try:
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)) as reader:
                return reader.read()
        except zstandard.ZstdError as exc:
            raise SessionFileError(f"{path}: not a valid zstd stream: {exc}") from None
    return raw


def check_header(raw: dict[str, Any]) -> SessionHeader:
    """Validate a header line; unsupported versions say so plainly."""
    missing = sorted(HEADER_REQUIRED - set(raw))
    extra = sorted(set(raw) - HEADER_REQUIRED - HEADER_OPTIONAL)
    version = raw.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and (
        version not in SUPPORTED_VERSIONS
    ):
        raise SessionFileError(
            f"unsupported session format version {version} (this reader supports "
            f"{', '.join(map(str, sorted(SUPPORTED_VERSIONS)))}); upgrade the processor"
        )
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unknown {', '.join(extra)}"] if extra else []
        )
        raise SessionFileError(f"session header line: {'; '.join(parts)}")
    if not isinstance(raw["id"], str) or not isinstance(raw["isSeeded"], bool):
        raise SessionFileError("session header line: id must be a string, isSeeded a boolean")
    return raw


def iter_lines(content: bytes) -> Iterator[tuple[int, bytes, bool]]:
    """Yield ``(byte offset, line, terminated)`` for every non-empty line."""
    pos, end = 0, len(content)
    while pos < end:
        nl = content.find(b"\n", pos)
        stop = end if nl < 0 else nl
        line = content[pos:stop]
        if line.strip():
            yield pos, line, nl >= 0
        pos = stop + 1


def parse_session_bytes(content: bytes, *, drop_torn_tail: bool = False,
                        session_id: str = "unknown",
                        stop_after_seq: int | None = None) -> SessionFile:
    """Parse a whole file; ``stop_after_seq`` ignores every line after that seq."""
    header: SessionHeader | None = None
    events: list[Event] = []
    torn: TornTail | None = None
    first = True
    for offset, line, terminated in iter_lines(content):
        if stop_after_seq is not None and events and events[-1].seq >= stop_after_seq:
            break
        try:
            raw = orjson.loads(line)
        except orjson.JSONDecodeError:
            if not terminated:
                torn = TornTail(offset, len(line))
                if drop_torn_tail:
                    break
                raise SessionFileError(
                    f"torn last line at byte offset {offset} ({len(line)} bytes); "
                    "pass --drop-torn-tail to fold without it"
                ) from None
            where = f"seq {events[-1].seq + 1}?" if events else "first event"
            raise SessionFileError(f"line at byte offset {offset} ({where}) is not valid JSON"
                                   ) from None
        if first and isinstance(raw, dict) and raw.get("type") == "session":
            header = check_header(raw)
            first = False
            continue
        first = False
        events.append(parse_event(raw, trusted_json=True))
    return SessionFile(
        header=header if header is not None else synthetic_header(session_id),
        events=events,
        has_header=header is not None,
        torn_tail=torn,
    )


def read_session_file(path: str | Path, *, drop_torn_tail: bool = False,
                      stop_after_seq: int | None = None) -> SessionFile:
    """Read a session log file (see the module docstring).

    A file without a header gets a synthetic one whose id is the file's stem
    (or its folder's name for the harness's ``session.jsonl`` naming).
    """
    p = Path(path)
    name = p.name.split(".")[0]
    if name == "session" and p.parent.name:
        name = p.parent.name
    return parse_session_bytes(read_bytes(p), drop_torn_tail=drop_torn_tail,
                               session_id=name, stop_after_seq=stop_after_seq)


def write_session_file(path: str | Path, header: SessionHeader | None,
                       events: list[Event]) -> None:
    """Write a session file (zstd when the name ends in .zst/.zstd)."""
    buf = bytearray()
    if header is not None:
        buf += orjson.dumps(header) + b"\n"
    for ev in events:
        buf += ev.to_bytes() + b"\n"
    data = bytes(buf)
    if str(path).endswith((".zst", ".zstd")):
        data = zstandard.ZstdCompressor(level=3).compress(data)
    Path(path).write_bytes(data)
