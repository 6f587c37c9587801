"""Where the runtime keeps its sessions, and which file of a session to read.

The runtime's JSONL persistence writes, under its root::

    <root>/--<normalized cwd>--/<escaped id>/session.vN.jsonl[.zstd]
    <root>/_no-cwd/<escaped id>/...

Each session directory holds one file per format generation
(``session.jsonl`` is v0, later ones ``session.vN.jsonl``; ``.zstd`` when
compressed) and a ``session.lock``.  A migration publishes the newer
generation beside the older one; readers use the highest.  Temporary files
(``session.migration.*.tmp``) and any other name are not generations.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from processor.files import version_of_filename

_ESCAPE = re.compile(r"~([0-9A-F]{4})")


def decode_segment(segment: str) -> str:
    """Inverse of the runtime's ``encodeSegment`` (``~XXXX`` is one UTF-16 unit)."""
    units = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), segment)
    return units.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def is_generation_name(name: str) -> bool:
    """A canonical generation name: ``session.jsonl`` or ``session.vN.jsonl``, ``.zstd`` or not."""
    if name.endswith(".zst"):
        return False  # the runtime writes .zstd only
    return version_of_filename(name) is not None


@dataclass(frozen=True, slots=True)
class SessionDir:
    """One session directory and its generation files (version -> path)."""

    path: Path
    generations: dict[int, Path]

    @property
    def dir_id(self) -> str:
        """The session id the directory name encodes."""
        return decode_segment(self.path.name)

    def newest(self) -> tuple[int, Path] | None:
        if not self.generations:
            return None
        version = max(self.generations)
        return version, self.generations[version]


def _generations(path: Path) -> dict[int, Path]:
    found: dict[int, Path] = {}
    try:
        entries = list(os.scandir(path))
    except OSError:
        return found
    for entry in entries:
        if not is_generation_name(entry.name):
            continue
        try:
            if not entry.is_file():
                continue
        except OSError:
            continue
        version = version_of_filename(entry.name)
        assert version is not None
        # a root holds one encoding; if both exist, the compressed one is the default
        prev = found.get(version)
        if prev is None or entry.name.endswith(".zstd"):
            found[version] = Path(entry.path)
    return found


def scan(root: Path) -> list[SessionDir]:
    """Every session directory under ``root`` holding at least one generation.

    Besides the runtime's two levels, a session directory directly under the
    root is accepted (a flat copy of sessions, as tests and demos make), and
    so is ROOT being one session directory.
    """
    out: list[SessionDir] = []
    own = _generations(root)
    if own:  # ROOT is one session directory
        return [SessionDir(root, own)]
    try:
        level1 = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return out
    for entry in level1:
        if not entry.is_dir(follow_symlinks=False):
            continue
        here = Path(entry.path)
        gens = _generations(here)
        if gens:
            out.append(SessionDir(here, gens))
            continue
        try:
            level2 = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError:
            continue
        for sub in level2:
            if sub.is_dir(follow_symlinks=False):
                gens = _generations(Path(sub.path))
                if gens:
                    out.append(SessionDir(Path(sub.path), gens))
    return out


def generations_of(path: Path) -> dict[int, Path]:
    """The generation files of one session directory now."""
    return _generations(path)
