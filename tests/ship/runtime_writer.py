"""A writer that lays session files out and appends to them as the runtime does.

The runtime's JSONL persistence (zsagi1368/deepseek-harness-zDSH, described
in docs/shipping.md): ``<root>/--<cwd key>--/<escaped id>/session.vN.jsonl``
plus ``.zstd``; the first append writes the header and the first batch; each
batch is lines, or one checksummed zstd frame, fsync'd; a failed write is
rolled back to the prior length; a crash can leave a torn last line or
frame, truncated before the next append; a migration publishes a new
generation (header + one frame of every event) through a temporary file and
``link``; a ``session.lock`` sits beside the log.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any

import orjson
import zstandard

from processor.core.events import Event
from processor.files import log_filename


def encode_segment(raw: str) -> str:
    if raw == ".":
        return "~002E"
    if raw == "..":
        return "~002E~002E"
    data = raw.encode("utf-16-le", "surrogatepass")
    units = [int.from_bytes(data[i : i + 2], "little") for i in range(0, len(data), 2)]
    return "".join(
        chr(u) if chr(u) != "~" and re.fullmatch(r"[A-Za-z0-9._-]", chr(u)) else f"~{u:04X}"
        for u in units
    )


def project_key(cwd: str) -> str:
    slug = re.sub(r"[/\\:]+", "-", cwd).lstrip("-") or "root"
    return f"--{slug[:251]}--"


def header(sid: str, version: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "type": "session",
        "version": version,
        "id": sid,
        "createdAt": 1_700_000_000_000,
        "isSeeded": False,
        "delegationDepth": 0,
        **extra,
    }


def frame(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(write_checksum=True).compress(data)


class RuntimeWriter:
    def __init__(
        self,
        root: Path,
        sid: str,
        *,
        cwd: str | None = "/work/proj",
        compressed: bool = True,
        version: int = 4,
        head: dict[str, Any] | None = None,
    ) -> None:
        self.sid = sid
        self.compressed = compressed
        self.version = version
        self.dir = root / (project_key(cwd) if cwd else "_no-cwd") / encode_segment(sid)
        self.head = head or header(sid, version, **({"cwd": cwd} if cwd else {}))
        self.path = self.dir / log_filename(version, compressed)
        self.events: list[Event] = []
        self.committed = 0
        #: complete records of a torn zstd frame, rewritten before the next batch
        self.recovered: list[Event] = []

    def _lines(self, events: list[Event]) -> bytes:
        return b"".join(e.to_bytes() + b"\n" for e in events)

    def _batch(self, events: list[Event]) -> bytes:
        body = self._lines(events)
        if self.committed == 0 and not self.path.exists():
            head = orjson.dumps(self.head) + b"\n"
            if self.compressed:
                return frame(head) + (frame(body) if events else b"")
            return head + body
        return frame(body) if self.compressed else body

    def _write(self, data: bytes) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "session.lock").touch()
        with open(self.path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def append(self, events: list[Event]) -> None:
        """One durable batch (the runtime's append resolves after fsync)."""
        self.truncate_torn()
        self._write(self._batch(self.recovered + events))
        self.recovered = []
        self.committed = self.path.stat().st_size
        self.events += events

    def write_torn(self, events: list[Event], keep: float = 0.5) -> None:
        """A crash mid-append: only a prefix of the batch reaches the disk."""
        assert self.committed > 0, "a torn first append is not modelled"
        self.truncate_torn()  # as every append of the runtime does first
        events = self.recovered + events
        self.recovered = []
        data = self._batch(events)
        cut = max(1, min(len(data) - 1, int(len(data) * keep)))
        self._write(data[:cut])
        # what the runtime's reader keeps of it: the complete lines (plain, the
        # torn line is cut), or the complete records of the torn frame (rewritten)
        if self.compressed:
            try:
                part = zstandard.ZstdDecompressor().decompressobj().decompress(data[:cut])
            except zstandard.ZstdError:
                part = b""
            self.recovered = events[: part.count(b"\n")]
        else:
            kept = data[:cut].count(b"\n")
            self.committed += data[:cut].rfind(b"\n") + 1
            self.events += events[:kept]
        return None

    @property
    def logical(self) -> list[Event]:
        """The events a reader of the log sees now."""
        return self.events + self.recovered

    def write_unterminated(self, event: Event) -> None:
        """A last line that parses as JSON but has no newline yet (plain files)."""
        assert not self.compressed
        self._write(event.to_bytes())

    def truncate_torn(self) -> None:
        """What the runtime does before its next append after a crash."""
        if self.path.exists() and self.path.stat().st_size > self.committed:
            os.truncate(self.path, self.committed)

    def rolled_back(self, events: list[Event]) -> None:
        """A batch written, then its fsync failed: the file goes back to its prior length."""
        self._write(self._batch(events))
        os.truncate(self.path, self.committed)

    def migrate(self, version: int, events: list[Event] | None = None) -> None:
        """Publish generation ``version`` beside the current one, holding the whole log."""
        events = self.events if events is None else events
        head = {**self.head, "version": version}
        name = log_filename(version, self.compressed)
        suffix = ".jsonl.zstd" if self.compressed else ".jsonl"
        tmp = self.dir / f"session.migration.{secrets.token_hex(8)}{suffix}.tmp"
        head_bytes = orjson.dumps(head) + b"\n"
        body = self._lines(events)
        data = frame(head_bytes) + frame(body) if self.compressed else head_bytes + body
        tmp.write_bytes(data)
        os.link(tmp, self.dir / name)
        tmp.unlink()
        self.version = version
        self.head = head
        self.path = self.dir / name
        self.events = list(events)
        self.committed = self.path.stat().st_size
