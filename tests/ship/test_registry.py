"""The registry: positions per (session, generation), and whether it was lost."""

from __future__ import annotations

from pathlib import Path

from processor.ship.registry import Position, Registry


def test_positions_round_trip_per_session_and_generation(tmp_path: Path) -> None:
    r = Registry(tmp_path / "s" / "ship.sqlite3")
    r.save([Position("a", 3, "/x/session.v3.jsonl", 10, 2, b"d" * 8)])
    r.save([Position("a", 4, "/x/session.v4.jsonl", 20, 5, b"e" * 8, 12, b"m" * 16)])
    r.save([Position("a", 4, "/y/moved.jsonl", 30, 7, None)])
    r.close()
    rows = Registry(tmp_path / "s" / "ship.sqlite3").load()["a"]
    assert rows[3].offset == 10 and rows[3].digest == b"d" * 8
    assert rows[4] == Position("a", 4, "/y/moved.jsonl", 30, 7, None, None, None)


def test_a_registry_stays_fresh_until_positions_are_known(tmp_path: Path) -> None:
    path = tmp_path / "ship.sqlite3"
    r = Registry(path)
    assert r.fresh
    r.close()
    r = Registry(path)
    assert r.fresh  # created, but the recovery from the topic did not happen
    r.mark_initialized()
    r.close()
    assert not Registry(path).fresh
