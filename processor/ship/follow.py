"""The follow loop: discover sessions, read what is complete, send, persist.

One thread reads and produces; a ``watchfiles`` thread only marks session
directories to look at, and a periodic rescan (``rescan_s``) catches what a
watcher can miss (an overflowed inotify queue, a network file system).
Bounds: one file open at a time, ``max_read_bytes`` read per session per
turn, ``max_inflight_bytes`` produced and not acknowledged, and at most
``max_unpersisted`` events per session sent past the registry's last commit
(what a ``kill -9`` makes us send again; below the processor's duplicate
window, so every such resend is dropped by its seq gate as a duplicate).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from processor.files import SUPPORTED_VERSIONS
from processor.ship import layout
from processor.ship.metrics import ShipMetrics
from processor.ship.reader import Record, Shrunk, TailReader, Unreadable, digest
from processor.ship.registry import Position, Registry
from processor.ship.sender import Sink, TooLarge
from processor.ship.session import Followed

log = logging.getLogger("processor.ship")

#: records in flight and no acknowledgement this long: /readyz says so
STALL_S = 30.0


@dataclass(frozen=True)
class Limits:
    max_read_bytes: int = 4 << 20
    max_inflight_bytes: int = 64 << 20
    #: below the processor's duplicate window (256 by default)
    max_unpersisted: int = 200
    commit_interval_s: float = 0.2
    rescan_s: float = 2.0


class Shipper:
    def __init__(
        self,
        root: Path,
        sink: Sink,
        registry: Registry,
        metrics: ShipMetrics | None = None,
        *,
        limits: Limits | None = None,
        floor: dict[str, int] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.root = root
        self.sink = sink
        self.registry = registry
        self.metrics = metrics or ShipMetrics()
        self.limits = limits or Limits()
        self.say = say or log.warning
        self.saved = registry.load()
        #: highest seq per session known to be on the topic (a lost registry)
        self.floor = floor or {}
        self.followed: dict[Path, Followed] = {}
        self.by_id: dict[str, Path] = {}
        #: (dir, generation) refused and why
        self.refused: dict[tuple[Path, int], str] = {}
        self.dirty: set[Path] = set()
        self._woken: set[Path] = set()
        self._wake_lock = threading.Lock()
        self.wake = threading.Event()
        self.stop = threading.Event()
        self._last_save = time.monotonic()
        self._last_scan = 0.0
        self.events_acked = 0
        #: counted here per ack, moved into the metrics once per turn
        self._acked_bytes = 0
        self._counted_events = 0
        self._last_ack = time.monotonic()

    # ------------------------------------------------------------ discovery

    def scan(self) -> None:
        """Find session directories and newer generations; mark changed files."""
        self._last_scan = time.monotonic()
        for sd in layout.scan(self.root):
            self._look(sd.path, sd.generations)
        self.metrics.sessions.set(len(self.followed))

    def _look(self, path: Path, generations: dict[int, Path]) -> None:
        newest = max(generations) if generations else None
        if newest is None:
            return
        f = self.followed.get(path)
        if f is not None and newest <= f.generation:
            self._check_stat(f)
            return
        if (path, newest) in self.refused:
            return
        gen_path = generations[newest]
        reader = TailReader(gen_path, compressed=gen_path.name.endswith(".zstd"))
        try:
            header, complete = reader.header()
        except (Unreadable, OSError) as exc:
            self._refuse_new(path, newest, f"{gen_path}: {_why(exc)}")
            return
        if not complete:
            return  # its first record is not on disk yet
        sid = str(header["id"]) if header is not None else layout.decode_segment(path.name)
        if header is not None and int(header["version"]) != newest and newest != 0:
            self._refuse_new(
                path, newest, f"{gen_path}: header says v{header['version']}, name v{newest}"
            )
            return
        if f is not None:
            self.say(
                f"session {sid}: following {gen_path.name} (a newer format generation); "
                f"seqs up to {f.sent_seq} already sent are not sent again"
            )
            self.metrics.switches.inc()
            if f.refused is not None:
                f.refused = None
                self.metrics.refused_now.set(len(self.refused))
            f.switch(newest, gen_path, reader)
            self.dirty.add(path)
            return
        other = self.by_id.get(sid)
        if other is not None and other != path:
            self._refuse_new(
                path, newest, f"{gen_path}: session {sid} is already read from {other}"
            )
            return
        f = Followed(path, sid, newest, gen_path, reader)
        self._resume(f)
        self.followed[path] = f
        self.by_id[sid] = path
        self.dirty.add(path)
        self.metrics.sessions.set(len(self.followed))

    def _resume(self, f: Followed) -> None:
        rows = self.saved.get(f.sid, {})
        row = rows.get(f.generation)
        try:
            size = f.path.stat().st_size
        except OSError:
            size = 0
        if row is not None and row.offset <= size:
            f.reader.offset = row.offset
            f.reader.started = row.offset > 0
            f.acked_offset = f.persisted_offset = row.offset
            f.sent_seq = f.acked_seq = f.persisted_seq = row.acked_seq
            f.acked_digest = row.digest
            if row.anchor is not None and row.anchor_start is not None:
                # the record before the position, checked before reading on
                f.reader.anchor = (row.anchor_start, row.anchor)
                f.boundaries.append((row.anchor_start, row.offset, row.anchor))
        else:
            known = max([r.acked_seq for r in rows.values()] + [self.floor.get(f.sid, -1)])
            f.sent_seq = f.acked_seq = f.persisted_seq = known
            if row is not None and row.acked_seq == known:
                f.acked_digest = row.digest  # the file shrank while we were away
            else:
                f.superseded_seq = known  # an older generation's, or the topic's

    def _check_stat(self, f: Followed) -> None:
        try:
            st = os.stat(f.path)
        except OSError:
            return
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        if key != f.stat:
            f.stat = key
            f.size = st.st_size
            self.dirty.add(f.dir)

    def _refuse_new(self, path: Path, generation: int, why: str) -> None:
        self.refused[(path, generation)] = why
        self.say(f"refused {why}")
        self.metrics.refused.labels("unreadable").inc()
        self.metrics.refused_now.set(len(self.refused))

    def _refuse(self, f: Followed, why: str, reason: str = "unreadable") -> None:
        f.refused = why
        self.refused[(f.dir, f.generation)] = why
        self.dirty.discard(f.dir)
        self.say(f"refused {f.path}: {why}; session {f.sid} is not followed further")
        self.metrics.refused.labels(reason).inc()
        self.metrics.refused_now.set(len(self.refused))

    # ------------------------------------------------------------ wake-ups

    def woken(self, paths: set[Path]) -> None:
        """Called from the watcher thread with session directories to look at."""
        with self._wake_lock:
            self._woken |= paths
        self.wake.set()

    def _take_woken(self) -> None:
        with self._wake_lock:
            woken, self._woken = self._woken, set()
        for path in woken:
            f = self.followed.get(path)
            gens = layout.generations_of(path)
            if f is None or (gens and max(gens) > f.generation):
                self._look(path, gens)
            elif f is not None:
                self.dirty.add(path)

    # ------------------------------------------------------------ reading

    def _blocked(self, f: Followed) -> str | None:
        if self.sink.inflight_bytes >= self.limits.max_inflight_bytes:
            return "inflight_bytes"
        if f.unpersisted >= self.limits.max_unpersisted:
            return "unpersisted_events"
        return None

    def pump(self, f: Followed) -> bool:
        """Send what is complete of one session; True when it may have more."""
        if f.refused is not None:
            return False
        if f.carry is not None:  # the rest of a record a bound stopped
            rec, index = f.carry
            f.carry = None
            done = self._send(f, rec, index)
            if done is not True:
                return done is None
        try:
            poll = f.reader.poll(self.limits.max_read_bytes)
        except Shrunk as exc:
            start = f.rewind_to(exc.size, exc.changed)
            self.metrics.shrinks.inc()
            self.say(
                f"session {f.sid}: {f.path.name} shrank to {exc.size} bytes"
                f"{' and changed' if exc.changed else ''} "
                f"(rolled back or repaired); reading again from byte {start}"
            )
            return True
        except Unreadable as exc:
            self._refuse(f, str(exc))
            return False
        except FileNotFoundError:
            return False  # replaced or removed: the next scan looks again
        except OSError as exc:
            self._refuse(f, exc.strerror or str(exc), "io")
            return False
        f.size = poll.size
        if poll.retry:
            return True
        for rec in poll.records:
            if rec.header is not None and str(rec.header["id"]) != f.sid:
                self._refuse(f, f"header id {rec.header['id']!r} is not session {f.sid!r}")
                return False
            done = self._send(f, rec, 0)
            if done is not True:
                return done is None
        return bool(poll.records) and poll.pending

    def _send(self, f: Followed, rec: Record, index: int) -> bool | None:
        """Send ``rec``'s events from ``index`` on: True when the record is done,
        None when a bound stopped it (the rest is carried), False when refused."""
        events = rec.events
        for i in range(index, len(events)):
            ev = events[i]
            dig = digest(ev)
            if ev.seq <= f.sent_seq:
                known = f.known_digest(ev.seq)
                if known is not None and known != dig:
                    self._refuse(
                        f,
                        f"seq {ev.seq} at byte offset {rec.start} differs from the event "
                        "already sent under that seq; not sending it",
                        "rewritten",
                    )
                    return False
                reason = "generation" if ev.seq <= f.superseded_seq else "resent"
                self.metrics.skipped.labels(reason).inc()
                continue
            if ev.seq != f.sent_seq + 1:
                self._refuse(
                    f,
                    f"seq {ev.seq} at byte offset {rec.start} follows seq {f.sent_seq} "
                    "(seqs missing)",
                )
                return False
            bound = self._blocked(f)
            if bound is not None:
                self.metrics.bound_hits.labels(bound).inc()
                f.carry = (rec, i)
                return None
            try:
                self.sink.send(f.sid, ev, self._acker(f, ev.seq))
            except TooLarge as exc:
                self._refuse(f, str(exc), "too_large")
                return False
            f.sent_seq = ev.seq
            f.remember(ev.seq, dig)
        f.reader.advance(rec)
        f.record_done(rec.start, rec.end, rec.mark)
        return True

    def _acker(self, f: Followed, seq: int) -> Callable[[str | None], None]:
        def acked(err: str | None) -> None:
            if err is not None:
                self.metrics.delivery_errors.inc()
                return
            self.events_acked += 1
            self._acked_bytes += f.on_ack(seq)
            self._last_ack = time.monotonic()

        return acked

    # ------------------------------------------------------------ persisting

    def save(self) -> None:
        """Commit the acknowledged positions that moved."""
        rows: list[Position] = []
        for f in self.followed.values():
            if f.acked_seq != f.persisted_seq or f.acked_offset != f.persisted_offset:
                if f.acked_seq < 0 and f.acked_offset == 0:
                    continue
                rows.append(f.position())
        self.registry.save(rows)
        for f in self.followed.values():
            f.persisted_seq = f.acked_seq
            f.persisted_offset = f.acked_offset
        if rows:
            self.metrics.commits.inc()
        self._last_save = time.monotonic()

    # ------------------------------------------------------------ the loop

    def turn(self) -> bool:
        """One pass over the sessions marked; True when work is left."""
        self._take_woken()
        if time.monotonic() - self._last_scan >= self.limits.rescan_s:
            self.scan()
        busy = False
        for path in list(self.dirty):
            f = self.followed.get(path)
            if f is None:
                self.dirty.discard(path)
                continue
            if self.pump(f):
                busy = True
            else:
                self.dirty.discard(path)
        self.sink.poll(0)
        if busy or time.monotonic() - self._last_save >= self.limits.commit_interval_s:
            self.save()
        self._count()
        self._report_broker()
        self.metrics.inflight.set(self.sink.inflight_bytes)
        self.metrics.set_lags({f.sid: f.lag for f in self.followed.values()})
        self.metrics.health.tick()
        return busy or bool(self.dirty)

    def run_once(
        self, flush_timeout: float = 300.0, on_turn: Callable[[], None] | None = None
    ) -> int:
        """Ship everything complete now; returns the records not acknowledged."""
        deadline = time.monotonic() + flush_timeout
        self.scan()
        while self.turn():
            if on_turn is not None:
                on_turn()
            if self.sink.fatal is not None or time.monotonic() > deadline:
                break  # the broker is not taking records: say what is left
            self.sink.poll(0.01)
        remaining = self.sink.flush(max(0.0, deadline - time.monotonic()))
        self.save()
        self._count()
        if not remaining and (self.dirty and time.monotonic() > deadline):
            return 1  # stopped with complete records still unread
        return remaining

    def _report_broker(self) -> None:
        """/readyz names a broker that acknowledges nothing while records wait."""
        health = self.metrics.health
        waited = time.monotonic() - self._last_ack
        if self.sink.inflight_bytes and waited >= STALL_S:
            health.degraded = (
                f"no acknowledgement from the broker for {waited:.0f}s "
                f"({self.sink.inflight_bytes} bytes in flight)"
            )
        elif not self.sink.inflight_bytes:
            self._last_ack = time.monotonic()
            health.degraded = None
        if self.sink.fatal is not None:
            health.fatal = self.sink.fatal

    def _count(self) -> None:
        self.metrics.events.inc(self.events_acked - self._counted_events)
        self._counted_events = self.events_acked
        self.metrics.bytes.inc(self._acked_bytes)
        self._acked_bytes = 0

    def run_follow(self, on_turn: Callable[[], None] | None = None) -> int:
        """Follow until :attr:`stop` is set; then flush and save."""
        self.scan()
        self.metrics.health.ready = True
        while not self.stop.is_set():
            busy = self.turn()
            if on_turn is not None:
                on_turn()
            if self.sink.fatal is not None:
                self.metrics.health.fatal = self.sink.fatal
                break
            if busy or self.sink.inflight_bytes:
                self.sink.poll(0.02)
                self.wake.wait(0.0 if busy else 0.02)
            else:
                self.wake.wait(self.limits.commit_interval_s)
            self.wake.clear()
        remaining = self.sink.flush(30.0)
        self.save()
        self._count()
        return remaining


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def watch(shipper: Shipper) -> threading.Thread:
    """A daemon thread telling ``shipper`` which session directories changed."""
    import watchfiles

    root = shipper.root

    def session_dir(p: Path) -> Path | None:
        try:
            rel = p.relative_to(root)
        except ValueError:
            return None
        parts = rel.parts
        if not parts:
            return None
        # <root>/<project>/<session>/<file> or <root>/<session>/<file>
        if layout.is_generation_name(parts[-1]):
            return p.parent
        return p if p.is_dir() else None

    def loop() -> None:
        try:
            for changes in watchfiles.watch(
                root, stop_event=shipper.stop, debounce=20, step=10, yield_on_timeout=False
            ):
                dirs = {d for _, name in changes if (d := session_dir(Path(name))) is not None}
                if dirs:
                    shipper.woken(dirs)
        except Exception as exc:
            shipper.say(
                f"file watcher stopped ({exc}); rescanning every {shipper.limits.rescan_s}s"
            )

    t = threading.Thread(target=loop, name="ship-watch", daemon=True)
    t.start()
    return t


__all__ = ["SUPPORTED_VERSIONS", "Limits", "Shipper", "watch"]
