"""The tail reader and the layout: complete records only, the runtime's names."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.ship import layout
from processor.ship.reader import Shrunk, TailReader, Unreadable
from tests.ship.helpers import events
from tests.ship.runtime_writer import RuntimeWriter, encode_segment, frame


def _read_all(reader: TailReader) -> list[int]:
    seqs = []
    while True:
        poll = reader.poll()
        for rec in poll.records:
            seqs += [e.seq for e in rec.events]
            reader.advance(rec)
        if not poll.records:
            return seqs


def test_layout_finds_sessions_by_project_and_escaped_id(tmp_path: Path) -> None:
    a = RuntimeWriter(tmp_path, "a/b~c", cwd="/home/u/proj")
    a.append(events(3))
    b = RuntimeWriter(tmp_path, "plain", cwd=None, compressed=False)
    b.append(events(2))
    (a.dir / "session.migration.0011.jsonl.zstd.tmp").write_bytes(b"partial")
    found = {sd.dir_id: sd for sd in layout.scan(tmp_path)}
    assert set(found) == {"a/b~c", "plain"}
    assert found["a/b~c"].path.parent.name == "--home-u-proj--"
    assert found["plain"].path.parent.name == "_no-cwd"
    assert found["a/b~c"].generations == {4: a.path}  # lock and temp files are not generations
    assert layout.decode_segment(encode_segment("é😀..")) == "é😀.."


def test_layout_newest_generation_wins(tmp_path: Path) -> None:
    w = RuntimeWriter(tmp_path, "s", version=3)
    w.append(events(3))
    w.migrate(4)
    (sd,) = layout.scan(tmp_path)
    assert sd.newest() == (4, w.path)
    assert not layout.is_generation_name("session.v04.jsonl")
    assert not layout.is_generation_name("session.lock")


def test_torn_last_line_is_not_read_until_complete_even_when_it_parses(tmp_path: Path) -> None:
    w = RuntimeWriter(tmp_path, "s", compressed=False)
    evs = events(6)
    w.append(evs[:3])
    w.write_unterminated(evs[3])  # valid JSON, no newline: torn
    reader = TailReader(w.path, compressed=False)
    assert _read_all(reader) == [0, 1, 2]
    with open(w.path, "ab") as f:
        f.write(b"\n")
    assert _read_all(reader) == [3]


def test_torn_zstd_frame_is_not_read_until_complete(tmp_path: Path) -> None:
    w = RuntimeWriter(tmp_path, "s")
    evs = events(8)
    w.append(evs[:4])
    full = frame(b"".join(e.to_bytes() + b"\n" for e in evs[4:]))
    with open(w.path, "ab") as f:
        f.write(full[: len(full) // 2])
    reader = TailReader(w.path, compressed=True)
    assert _read_all(reader) == [0, 1, 2, 3]
    assert reader.poll().pending
    with open(w.path, "ab") as f:
        f.write(full[len(full) // 2 :])
    assert _read_all(reader) == [4, 5, 6, 7]


def test_header_record_is_read_and_checked(tmp_path: Path) -> None:
    w = RuntimeWriter(tmp_path, "s")
    w.append(events(2))
    head, complete = TailReader(w.path, compressed=True).header()
    assert complete and head is not None and head["id"] == "s"


def test_corrupt_frame_in_the_middle_is_unreadable(tmp_path: Path) -> None:
    w = RuntimeWriter(tmp_path, "s")
    w.append(events(2))
    good = w.path.stat().st_size
    w.append(events(4)[2:])
    data = bytearray(w.path.read_bytes())
    data[good + 12] ^= 0xFF
    w.path.write_bytes(bytes(data))
    w.append(events(6)[4:])
    reader = TailReader(w.path, compressed=True)
    with pytest.raises(Unreadable, match=f"byte offset {good}"):
        _read_all(reader)


def test_a_frame_ending_inside_a_line_is_unreadable(tmp_path: Path) -> None:
    w = RuntimeWriter(tmp_path, "s")
    w.append(events(1))
    with open(w.path, "ab") as f:
        f.write(frame(b'{"type":"x","seq":1'))
    with pytest.raises(Unreadable, match="ends inside a line"):
        _read_all(TailReader(w.path, compressed=True))


def test_a_shorter_file_is_reported_as_shrunk(tmp_path: Path) -> None:
    w = RuntimeWriter(tmp_path, "s", compressed=False)
    w.append(events(3))
    reader = TailReader(w.path, compressed=False)
    _read_all(reader)
    w.path.write_bytes(w.path.read_bytes()[:10])
    with pytest.raises(Shrunk):
        reader.poll()


def test_not_the_runtime_format_is_unreadable(tmp_path: Path) -> None:
    d = tmp_path / "_no-cwd" / "x"
    d.mkdir(parents=True)
    (d / "session.v4.jsonl").write_bytes(b"hello world\n")
    with pytest.raises(Unreadable, match="not valid JSON"):
        _read_all(TailReader(d / "session.v4.jsonl", compressed=False))
    (d / "session.v4.jsonl.zstd").write_bytes(b"hello world\n")
    with pytest.raises(Unreadable, match="not a zstd frame"):
        _read_all(TailReader(d / "session.v4.jsonl.zstd", compressed=True))


def test_root_may_be_one_session_directory(tmp_path: Path) -> None:
    w = RuntimeWriter(tmp_path, "one")
    w.append(events(2))
    (sd,) = layout.scan(w.dir)
    assert sd.path == w.dir and sd.dir_id == "one"
