"""Session files written by the agent harness (docs/session-semantics.md §11).

JSON Lines: an optional header line ``{"type": "session", ...}`` then one
event envelope per line in seq order; plain or zstd-compressed (``.zst`` /
``.zstd``, or recognised by the zstd magic bytes).  The runtime names a log
``session.jsonl`` (format 0) or ``session.vN.jsonl`` and adds ``.zstd`` when
compressed (:func:`log_filename`).  Formats 3 and 4 are read as written, each
with its own message rules; older ones are refused naming the version.

Nothing is lost quietly: a truncated or corrupt zstd stream, a byte-order
mark, an empty file, a line over :data:`MAX_LINE_BYTES` and a header line with
a wrong field are each refused with one line.  A crashed writer can leave a
torn last line: it is reported with its byte offset and refused unless the
caller explicitly drops it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

import orjson
import zstandard

from processor.core.errors import InvalidInput, SessionError, raised_from
from processor.core.events import Event, parse_event_owned
from processor.core.log import SessionHeader
from processor.core.session import synthetic_header

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
UTF8_BOM = b"\xef\xbb\xbf"
#: The runtime's newest session format (its ``SESSION_FORMAT_VERSION``).
CURRENT_VERSION = 4
#: Versions read as written: v4, and the released v3 whose messages differ
#: (see :func:`processor.core.event_checks.check_message_shape`).
SUPPORTED_VERSIONS = frozenset({3, 4})
HEADER_REQUIRED = frozenset({"type", "version", "id", "createdAt", "isSeeded", "delegationDepth"})
HEADER_OPTIONAL = frozenset({"cwd", "parentSession", "origin", "agentPreset"})
#: Policy fields of pre-release headers that the runtime refuses by name.
RETIRED_HEADER_FIELDS = ("sandboxMode", "approvalPolicy")
#: Bounds on what one file may make us hold: a line and the decompressed file.
MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_FILE_BYTES = 1024 * 1024 * 1024
MAX_SAFE_INT = 2**53 - 1


class SessionFileError(InvalidInput, ValueError):
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

    @property
    def dialect(self) -> int | None:
        """Message rules of the header's format version; None without a header."""
        return int(self.header["version"]) if self.has_header else None


def log_filename(version: int, compressed: bool = False) -> str:
    """The runtime's name for one format generation of a session's log.

    Version 0 is ``session.jsonl``; later versions ``session.vN.jsonl``; a
    zstd-compressed log adds ``.zstd``.
    """
    base = "session.jsonl" if version == 0 else f"session.v{version}.jsonl"
    return base + (".zstd" if compressed else "")


def version_of_filename(name: str) -> int | None:
    """The format version a canonical log file name declares, or None."""
    m = re.fullmatch(r"session(?:\.v([1-9][0-9]*))?\.jsonl(?:\.zstd?)?", name)
    if m is None:
        return None
    return int(m.group(1)) if m.group(1) else 0


def _decompress(raw: bytes, path: str | Path) -> bytes:
    """Every zstd frame of ``raw``; a truncated or corrupt stream is refused."""
    dctx = zstandard.ZstdDecompressor()
    out = bytearray()
    data = raw
    while data:
        dobj = dctx.decompressobj()
        try:
            out += dobj.decompress(data)
        except zstandard.ZstdError as exc:
            err = SessionFileError(f"{path}: corrupt zstd data: {exc}")
            raise raised_from(err, None) from None
        if not dobj.eof:
            raise SessionFileError(
                f"{path}: truncated zstd stream (the last frame ends early after "
                f"{len(out)} decompressed bytes); the file was cut short"
            )
        if len(out) > MAX_FILE_BYTES:
            raise SessionFileError(
                f"{path}: decompresses to more than {MAX_FILE_BYTES} bytes; refused"
            )
        data = dobj.unused_data
        if data and not data.startswith(ZSTD_MAGIC):
            raise SessionFileError(f"{path}: trailing bytes after the last zstd frame")
    return bytes(out)


def read_bytes(path: str | Path) -> bytes:
    """The decompressed content of a session file (BOM and empty files refused)."""
    raw = Path(path).read_bytes()
    if not raw:
        raise SessionFileError(f"{path}: empty file (no header line, no events)")
    if raw.startswith(ZSTD_MAGIC) or str(path).endswith((".zst", ".zstd")):
        if not raw.startswith(ZSTD_MAGIC):
            raise SessionFileError(f"{path}: named as zstd but does not start with a zstd frame")
        raw = _decompress(raw, path)
        if not raw:
            raise SessionFileError(f"{path}: empty file (no header line, no events)")
    elif len(raw) > MAX_FILE_BYTES:
        raise SessionFileError(f"{path}: larger than {MAX_FILE_BYTES} bytes; refused")
    if raw.startswith(UTF8_BOM):
        raise SessionFileError(
            f"{path}: starts with a UTF-8 byte-order mark (EF BB BF); session logs are "
            "plain UTF-8 JSON Lines without one"
        )
    return raw


def _safe_nonneg(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INT


def check_header(raw: dict[str, Any]) -> SessionHeader:
    """Validate a header line as the runtime's reader does.

    A version this reader does not read is refused first, before any shape
    check (a newer format need not look like this one): versions 0-2 need the
    runtime's own migrations, newer ones a newer processor.
    """
    version = raw.get("version")
    if (
        isinstance(version, int | float)
        and not isinstance(version, bool)
        and (version not in SUPPORTED_VERSIONS)
    ):
        if isinstance(version, int) and 0 <= version < min(SUPPORTED_VERSIONS):
            raise SessionFileError(
                f"session format v{version} is not read here: it needs the runtime's "
                f"v{version}->v{CURRENT_VERSION} migrations (open it once with the agent "
                f"runtime, which rewrites it as {log_filename(CURRENT_VERSION)})"
            )
        raise SessionFileError(
            f"unsupported session format version {version} (this reader supports "
            f"{', '.join(map(str, sorted(SUPPORTED_VERSIONS)))}); upgrade the processor"
        )
    retired = [k for k in RETIRED_HEADER_FIELDS if k in raw]
    if retired:
        raise SessionFileError(f"session header uses retired policy field(s): {', '.join(retired)}")
    missing = sorted(HEADER_REQUIRED - set(raw))
    extra = sorted(set(raw) - HEADER_REQUIRED - HEADER_OPTIONAL)
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unknown {', '.join(extra)}"] if extra else []
        )
        raise SessionFileError(f"session header line: {'; '.join(parts)}")
    problems = []
    if not isinstance(raw["version"], int) or isinstance(raw["version"], bool):
        problems.append("version must be a number")
    if not isinstance(raw["id"], str):
        problems.append("id must be a string")
    if not isinstance(raw["isSeeded"], bool):
        problems.append("isSeeded must be a boolean")
    if not _safe_nonneg(raw["createdAt"]):
        problems.append("createdAt must be a non-negative safe integer")
    if not _safe_nonneg(raw["delegationDepth"]):
        problems.append("delegationDepth must be a non-negative safe integer")
    cwd = raw.get("cwd")
    if "cwd" in raw and not (isinstance(cwd, str) and PurePosixPath(cwd).is_absolute()):
        problems.append("cwd must be an absolute path")
    if "parentSession" in raw and not isinstance(raw["parentSession"], str):
        problems.append("parentSession must be a string")
    if "origin" in raw and raw["origin"] != "subagent":
        problems.append("origin must be 'subagent'")
    if "agentPreset" in raw and not isinstance(raw["agentPreset"], str):
        problems.append("agentPreset must be a string")
    if problems:
        raise SessionFileError(f"session header line: {'; '.join(problems)}")
    return raw


def iter_lines(
    content: bytes,
    max_line_bytes: int | None = None,
) -> Iterator[tuple[int, bytes, bool]]:
    """Yield ``(byte offset, line, terminated)`` for every non-empty line.

    A line longer than ``max_line_bytes`` is refused with its offset and size
    (a consumer could not carry it, and holding it is unbounded).
    """
    limit = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    pos, end = 0, len(content)
    while pos < end:
        nl = content.find(b"\n", pos)
        stop = end if nl < 0 else nl
        if stop - pos > limit:
            raise _line_too_long(pos, stop - pos, limit)
        line = content[pos:stop]
        if line.strip():
            yield pos, line, nl >= 0
        pos = stop + 1


#: what a line that is not JSON decodes to in :func:`json_lines`
_NOT_JSON: Final = object()
#: compiled, a Final is a C static; ``orjson.loads`` was a module attribute
#: lookup per line
_loads: Final = orjson.loads


def _not_json(
    offset: int, line: bytes, terminated: bool, drop_torn_tail: bool, where: Callable[[], str]
) -> TornTail:
    """The answer to a line that is not JSON: a torn last line (a crash
    mid-write) is refused, or with ``drop_torn_tail`` returned as its
    :class:`TornTail`; any other line is refused naming its offset and
    ``where()``.  Shared by :func:`json_lines` and :func:`parse_session_bytes`
    so both word it alike."""
    if not terminated:
        if drop_torn_tail:
            return TornTail(offset, len(line))
        raise SessionFileError(
            f"torn last line at byte offset {offset} ({len(line)} bytes); "
            "pass --drop-torn-tail to fold without it"
        )
    hint = where()
    raise SessionFileError(
        f"line at byte offset {offset}{f' ({hint})' if hint else ''} is not valid JSON"
    )


def _line_too_long(pos: int, size: int, limit: int) -> SessionFileError:
    return SessionFileError(
        f"line at byte offset {pos} is {size} bytes, over the {limit}-byte line limit"
    )


def json_lines(
    content: bytes,
    *,
    drop_torn_tail: bool = False,
    where: Callable[[], str] = lambda: "",
) -> Iterator[tuple[int, Any, TornTail | None]]:
    """``(byte offset, JSON value, None)`` for every line, in order.

    A last line without its newline that is not JSON is a torn tail (a crash
    mid-write): refused, or with ``drop_torn_tail`` yielded once as
    ``(offset, None, TornTail)`` and the iteration ends.  Any other line that
    is not JSON is refused naming its offset (and ``where()``, e.g. the seq it
    must have).  ``ingest --raw`` reads files through this path; the fold's
    :func:`parse_session_bytes` has the same loop inline.
    """
    for offset, line, terminated in iter_lines(content):
        try:
            value = _loads(line)
        except orjson.JSONDecodeError:
            # answered below, outside the handler: a compiled generator that
            # yields inside an except block leaves the handled error current
            # in its caller, chained into any later error (mypyc)
            value = _NOT_JSON
        if value is not _NOT_JSON:
            yield offset, value, None
            continue
        yield offset, None, _not_json(offset, line, terminated, drop_torn_tail, where)
        return


def is_header_line(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "session"


def parse_session_bytes(
    content: bytes,
    *,
    drop_torn_tail: bool = False,
    session_id: str = "unknown",
    stop_after_seq: int | None = None,
) -> SessionFile:
    """Parse a whole file; ``stop_after_seq`` ignores every line after that seq."""
    header: SessionHeader | None = None
    events: list[Event] = []
    torn: TornTail | None = None
    first = True

    def where() -> str:
        return f"seq {events[-1].seq + 1}?" if events else "first event"

    # json_lines' loop inline (the same lines, limits and answers): its two
    # stacked generators cost a resume and a tuple each per line, and the
    # fold reads every line of the log through here
    limit = MAX_LINE_BYTES
    pos, end = 0, len(content)
    while pos < end:
        nl = content.find(b"\n", pos)
        stop = end if nl < 0 else nl
        if stop - pos > limit:
            raise _line_too_long(pos, stop - pos, limit)
        line = content[pos:stop]
        offset = pos
        pos = stop + 1
        # blank: nothing but whitespace (an event line starts with "{": no
        # method call for those; compiled, line[0] is a C index)
        if not line or (line[0] != 0x7B and not line.strip()):
            continue
        try:
            raw = _loads(line)
        except orjson.JSONDecodeError:
            raw = _NOT_JSON  # answered outside the handler, as in json_lines
        if raw is _NOT_JSON:
            torn = _not_json(offset, line, nl >= 0, drop_torn_tail, where)
            break
        if stop_after_seq is not None and events and events[-1].seq >= stop_after_seq:
            break
        if first and is_header_line(raw):
            header = check_header(raw)
            first = False
            continue
        first = False
        try:
            events.append(parse_event_owned(raw))  # raw is this loop's alone
        except SessionError as exc:
            if exc.seq is not None:
                raise
            # No usable seq on the line: name its position, the seq it must have.
            index = events[-1].seq + 1 if events else 0
            raise raised_from(SessionError(index, exc.rule, exc.reason), None) from None
    return SessionFile(
        header=header if header is not None else synthetic_header(session_id),
        events=events,
        has_header=header is not None,
        torn_tail=torn,
    )


def file_session_id(path: str | Path) -> str:
    """The id of a header-less file: its stem, or its folder's name for the
    runtime's ``<session>/session.v4.jsonl`` naming."""
    p = Path(path)
    name = p.name.split(".")[0]
    if name == "session" and p.parent.name:
        name = p.parent.name
    return name


def read_session_file(
    path: str | Path, *, drop_torn_tail: bool = False, stop_after_seq: int | None = None
) -> SessionFile:
    """Read a session log file (see the module docstring).

    A file without a header gets a synthetic one whose id is
    :func:`file_session_id`.
    """
    return parse_session_bytes(
        read_bytes(path),
        drop_torn_tail=drop_torn_tail,
        session_id=file_session_id(path),
        stop_after_seq=stop_after_seq,
    )


def write_session_file(path: str | Path, header: SessionHeader | None, events: list[Event]) -> None:
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
