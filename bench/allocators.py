"""What holds a process's memory, by allocator (Linux, glibc; a part that
cannot be read is left out): SQLite's own count, glibc malloc's in-use and
free bytes, pymalloc's arenas, and the resident size after ``malloc_trim``.

Resident memory that no session holds is mostly allocator state: SQLite's
page caches (malloc), pymalloc arenas kept by a few live objects after the
sessions that filled them were evicted, and free malloc chunks the heap
does not give back.  ``bench/state_budget.py`` reports these beside its RSS
growth, so the "fixed overhead" is measured, not guessed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile

from bench.common import rss_bytes

#: pymalloc's arena size on 64-bit Python 3.10+ (radix tree: 1 MiB arenas)
PY_ARENA_BYTES = 1 << 20


_MALLINFO2 = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2.split(" ")]


def _lib(name: str) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def py_arenas() -> int | None:
    """pymalloc arenas allocated now (``sys._debugmallocstats``, written to fd 2)."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        for line in out.read().decode(errors="replace").splitlines():
            if "arenas allocated current" in line:
                return int(line.rpartition("=")[2].strip().replace(",", ""))
    return None


def breakdown(trim: bool = True) -> dict[str, int | None]:
    """The allocators' counts now; ``trim``: then ``malloc_trim(0)`` and the RSS after it."""
    out: dict[str, int | None] = {"rss": rss_bytes(), "sqlite_bytes": None}
    sqlite = _lib("libsqlite3.so.0")  # the library the sqlite3 module loaded
    if sqlite is not None:
        sqlite.sqlite3_memory_used.restype = ctypes.c_int64
        out["sqlite_bytes"] = int(sqlite.sqlite3_memory_used())
    libc = _lib("libc.so.6")
    mallinfo2 = getattr(libc, "mallinfo2", None) if libc is not None else None
    if mallinfo2 is not None:
        mallinfo2.restype = _MallInfo2
        info = mallinfo2()
        out["malloc_in_use"] = int(info.uordblks) + int(info.hblkhd)
        out["malloc_free"] = int(info.fordblks)
    arenas = py_arenas()
    out["py_arena_bytes"] = None if arenas is None else arenas * PY_ARENA_BYTES
    if trim and libc is not None:
        with contextlib.suppress(AttributeError):
            libc.malloc_trim(0)
            out["rss_trimmed"] = rss_bytes()
    return out
