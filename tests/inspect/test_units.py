"""Pure parts of the inspector: redaction, the diff, the time-travel fold."""

from __future__ import annotations

from typing import Any

from processor.client.views_reader import offline_equivalent
from processor.codec import default_codec
from processor.core.events import make_event
from processor.examples.make_example import EXAMPLE_PATH
from processor.files import read_session_file
from processor.inspect.history import LoggedRecord, diff, fold_document, fold_records
from processor.inspect.redact import REDACTED, redact
from processor.offline import fold_events, session_output


def test_redact_hides_secret_named_keys_and_keeps_counts() -> None:
    doc: dict[str, Any] = {
        "config": {"provider": "p", "model": "m", "apiKey": "sk-live-1", "maxTokens": 10},
        "usage": {"inputTokens": 5, "outputTokens": 7},
        "kafka": {"sasl.password": "hunter2", "sasl.username": "bob"},
        "nested": [{"Authorization": "Bearer x"}, {"access_token": "t"}, {"token": "z"}],
        "key": "session-1",
        "toolCallId": "call-1",
    }
    out = redact(doc)
    text = repr(out)
    for secret in ("sk-live-1", "hunter2", "bob", "Bearer x", "'t'", "'z'"):
        assert secret not in text
    assert out["config"]["apiKey"] == REDACTED and out["config"]["maxTokens"] == 10
    assert out["usage"] == {"inputTokens": 5, "outputTokens": 7}
    assert out["key"] == "session-1" and out["toolCallId"] == "call-1"
    assert doc["config"]["apiKey"] == "sk-live-1"  # the input is not touched


def test_redact_is_bounded_in_depth() -> None:
    deep: Any = "x"
    for _ in range(1000):
        deep = [deep]
    assert "[too deep]" in repr(redact(deep))


def test_diff_reports_paths_and_is_bounded() -> None:
    then = {"a": 1, "b": [1, 2], "c": {"d": "x"}}
    now = {"a": 2, "b": [1, 2, 3], "c": {}, "e": True}
    assert diff(then, now) == [
        {"path": "a", "kind": "changed", "then": 1, "now": 2},
        {"path": "b[2]", "kind": "added", "now": 3},
        {"path": "c.d", "kind": "removed", "then": "x"},
        {"path": "e", "kind": "added", "now": True},
    ]
    assert diff(then, then) == []
    assert len(diff(list(range(1000)), list(range(1, 1001)), limit=10)) == 10


def _records(sid: str, events: list[Any]) -> list[LoggedRecord]:
    codec = default_codec()
    return [
        LoggedRecord(i, codec.decode_event(codec.encode_parsed_event(sid, ev)))
        for i, ev in enumerate(events)
    ]


def test_time_travel_fold_equals_the_offline_fold_of_the_prefix() -> None:
    events = read_session_file(EXAMPLE_PATH).events
    records = _records("s", events)
    for upto in (0, 20, 40, 64):
        got = fold_document(fold_records("s", records, set(), upto))
        want = offline_equivalent(session_output(fold_events(events[: upto + 1])))
        assert got == want


def test_time_travel_skips_what_the_dlq_holds_and_resends() -> None:
    """A refused record (named by its offset in the DLQ) and a re-send are not folded;
    a refusal the DLQ does not (yet) name is reported, not hidden."""
    events = read_session_file(EXAMPLE_PATH).events[:20]
    gap = make_event("turn/start", 25, {"turn": 9})
    records = _records("s", [*events[:10], gap, events[9], *events[10:]])
    fold = fold_records("s", records, {10}, None)
    assert fold.session.last_seq == 19
    assert fold.skipped == [{"offset": 10, "seq": 25, "why": "dead letter"}]
    assert fold_document(fold) == offline_equivalent(session_output(fold_events(events)))
    fold = fold_records("s", records, set(), None)
    assert [s["offset"] for s in fold.skipped] == [10] and "S-1" in fold.skipped[0]["why"]
    control = LoggedRecord(99, None, "control record (processor-control)")
    assert fold_records("s", [*records, control], {10}, None).session.last_seq == 19


def test_a_missing_browser_is_a_clear_failure_not_a_skip() -> None:
    from tests.inspect.conftest import CHROMEDRIVER, missing_browser

    problem = missing_browser("/nonexistent/chromium", CHROMEDRIVER)
    assert problem is not None
    assert "apt-get install -y chromium chromium-driver" in problem
    assert "missing package: chromium" in problem
    problem = missing_browser("/bin/sh", "/nonexistent/chromedriver")
    assert problem is not None and "missing package: chromium-driver" in problem


def test_dead_letter_memory_is_bounded_and_says_so(monkeypatch: Any) -> None:
    from processor.codec import DeadLetter
    from processor.inspect import state

    monkeypatch.setattr(state, "MAX_OFFSETS_PER_SESSION", 3)
    box = state.Letters()
    for offset in range(state.MAX_LETTERS_PER_SESSION + 5):
        box.add(DeadLetter("s", "t.events", 0, offset, offset, "S-1", "gap", b"s", b"", 0, "p"))
    assert box.total == state.MAX_LETTERS_PER_SESSION + 5
    assert len(box.kept) == state.MAX_LETTERS_PER_SESSION and box.kept[-1].offset == box.total - 1
    assert box.offsets == {("t.events", 0, 0), ("t.events", 0, 1), ("t.events", 0, 2)}
    assert box.offsets_complete is False


def test_a_new_subscriber_starts_with_a_resync() -> None:
    """A page reads its first state, then opens its stream: what committed in
    between (the whole load, on a slow box) is announced by the first notice,
    or the page shows "loading" forever (CI, stop 28)."""
    from processor.config import ServiceConfig
    from processor.inspect.state import InspectorState

    state = InspectorState(ServiceConfig(bootstrap_servers="127.0.0.1:1"))  # never started
    woken: list[int] = []
    sub = state.subscribe(None, lambda: woken.append(1))
    assert state.take(sub) == ([], True)
    assert state.take(sub) == ([], False)
