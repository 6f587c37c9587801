"""The inspector page in a real headless Chromium against a real broker and processor.

One scenario, in order (each step needs the state the previous one left):
a session appears in the list; its transcript grows live while events are
produced (no reload); a bad event shows the quarantine and its dead letter;
redrive is refused without the token and lifts the quarantine with it; time
travel shows the earlier surface (with the image-offloaded content marked)
and a diff against now.  The processor splits views into 256-byte parts and
pages the transcript by 8, so the page is read through split views.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import orjson
import pytest
from selenium.webdriver.common.by import By

from processor.client.session_writer import SessionWriter
from processor.client.views_reader import read_committed_records
from processor.codec import default_codec
from processor.core.events import make_event
from processor.examples.make_example import EXAMPLE_PATH
from processor.files import read_session_file
from processor.kafka import clients
from processor.offline import fold_events
from tests.inspect.conftest import TOKEN, InspectStack, save_failure_screenshot, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.browser]

SID = "inspect-me"
OTHER = "other-session"
SECRET_SID = "secret-session"
SECRET = "sk-live-should-never-be-rendered"


def js(driver: Any, script: str) -> Any:
    return driver.execute_script(script)


def count(driver: Any, selector: str) -> int:
    return int(
        js(driver, f"return document.querySelectorAll({orjson.dumps(selector).decode()}).length")
    )


def text(driver: Any, selector: str) -> str:
    els = driver.find_elements(By.CSS_SELECTOR, selector)
    return " ".join(e.text for e in els)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as res:
        return orjson.loads(res.read())


def test_inspector_page_live_quarantine_redrive_time_travel(
    inspect_stack: InspectStack, chrome: Any
) -> None:
    driver = chrome
    stack = inspect_stack
    url = stack.server.url
    events = read_session_file(EXAMPLE_PATH).events
    last = events[-1].seq  # the example log: a compaction in its last third
    assert len(events) == last + 1 > 60
    next_turn = 1 + max(e.data["turn"] for e in events if e.type == "turn/start")
    expected_transcript = {n: len(fold_events(events[: n + 1]).transcript()) for n in (20, 44)}
    try:
        with SessionWriter(stack.config) as writer:
            for ev in events[:21]:
                writer.append_event(SID, ev)
            for ev in events[:11]:
                writer.append_event(OTHER, ev)

            # --- the session appears in the list; search narrows it
            driver.get(url)
            wait_for(
                "both sessions in the list",
                lambda: (
                    count(driver, f"tr[data-session='{SID}']") == 1
                    and count(driver, f"tr[data-session='{OTHER}']") == 1
                ),
            )
            box = driver.find_element(By.ID, "search")
            box.send_keys("other")
            wait_for(
                "the search to keep only the other session",
                lambda: (
                    count(driver, "#session-list tbody tr") == 1
                    and count(driver, f"tr[data-session='{OTHER}']") == 1
                ),
            )
            box.clear()
            box.send_keys(SID[:7])
            wait_for(
                "the search to keep only our session",
                lambda: (
                    count(driver, "#session-list tbody tr") == 1
                    and count(driver, f"tr[data-session='{SID}']") == 1
                ),
            )

            # --- the session page; the transcript grows live, without a reload
            driver.find_element(By.CSS_SELECTOR, f"tr[data-session='{SID}'] a").click()
            wait_for(
                "the transcript up to seq 20",
                lambda: count(driver, "#transcript .entry") == expected_transcript[20],
            )
            js(driver, "window.__sameDocument = 'yes'")
            for ev in events[21:45]:
                writer.append_event(SID, ev)
            wait_for(
                "the transcript to grow to seq 44",
                lambda: (
                    count(driver, "#transcript .entry") == expected_transcript[44]
                    and "asOfSeq 44" in text(driver, "#as-of-seq")
                ),
            )
            assert js(driver, "return window.__sameDocument") == "yes", "the page reloaded"
            for ev in events[45:]:
                writer.append_event(SID, ev)
            wait_for(
                "the compaction on the surface",
                lambda: (
                    f"asOfSeq {last}" in text(driver, "#as-of-seq")
                    and count(driver, "#surface .badge.replace") >= 1
                ),
            )
            assert count(driver, "#surface .node") == len(fold_events(events).surface.state.nodes)
            assert count(driver, "#surface-mismatch") == 0
            keys = [
                m.key() or b""
                for m in read_committed_records(stack.config, stack.config.topics.views)
            ]
            assert any(k.startswith(SID.encode()) and b"#" in k for k in keys), (
                "no view was split into parts: the test would not cover reassembly"
            )
            units = [u["name"] for u in get_json(f"{url}api/session?id={SID}")["units"]]
            assert {"requestHeader", "toolHistory", "sessionStats", "todos"} <= set(units)
            assert count(driver, "#units tr[data-unit]") == len(units)
            assert "requestHeader" in text(driver, "#units")
            header = fold_events(events).projections.state_of("requestHeader")
            request = text(driver, "#request")
            assert f"seq {header['seq']}" in request and header["reason"] in request
            assert header["header"]["config"]["model"] in request
            assert "Tool history" in request

            # --- a bad event (a gap: seq last + 2 after last) quarantines the session
            producer = clients.event_producer(stack.config)
            bad = make_event("turn/start", last + 2, {"turn": 9})
            producer.produce(
                stack.config.topics.events,
                key=SID.encode(),
                value=default_codec().encode_parsed_event(SID, bad),
            )
            assert producer.flush(30) == 0
            wait_for(
                "the quarantine and its dead letter",
                lambda: (
                    count(driver, "#quarantine") == 1
                    and count(driver, "#dead-letters tr.letter") == 1
                ),
            )
            assert "quarantined" in text(driver, "#status-badge")
            assert "S-1" in text(driver, "#quarantine-reason")
            letter = text(driver, "#dead-letters tr.letter")
            assert "S-1" in letter and "gap" in letter
            letters = get_json(f"{url}api/session?id={SID}")["deadLetters"]
            assert [(d["seq"], d["rule"]) for d in letters] == [(last + 2, "S-1")]
            assert f"{letters[0]['partition']}" in letter and f"{letters[0]['offset']}" in letter

            # --- redrive: refused without the right token, done with it
            driver.find_element(By.ID, "redrive-token").send_keys("wrong-token")
            driver.find_element(By.ID, "redrive-button").click()
            wait_for("the refusal", lambda: "refused" in text(driver, "#redrive-result"))
            assert "quarantined" in text(driver, "#status-badge")
            token_box = driver.find_element(By.ID, "redrive-token")
            token_box.clear()
            token_box.send_keys(TOKEN)
            driver.find_element(By.ID, "redrive-button").click()
            wait_for(
                "the quarantine to lift",
                lambda: text(driver, "#status-badge") == "ok" and count(driver, "#quarantine") == 0,
            )
            writer.append(SID, "turn/start", {"turn": next_turn})  # the session flows again
            wait_for(
                f"seq {last + 1} folded after the redrive",
                lambda: f"asOfSeq {last + 1}" in text(driver, "#as-of-seq"),
            )
            assert TOKEN not in driver.page_source
            assert TOKEN.encode() not in urllib.request.urlopen(f"{url}api/health").read()

        # --- time travel to seq 40: before the compaction, with the image offloaded
        then = fold_events(events[:41]).surface.state
        now = fold_events(events).surface.state
        gone = [s for s in then.nodes if s not in now.nodes]
        assert gone and then.overrides
        seq_box = driver.find_element(By.ID, "tt-seq")
        seq_box.clear()
        seq_box.send_keys("40")
        driver.find_element(By.ID, "tt-go").click()
        wait_for(
            "the surface at seq 40", lambda: count(driver, "#tt-surface .node") == len(then.nodes)
        )
        shown = [
            int(x)
            for x in js(
                driver,
                "return [...document.querySelectorAll("
                "'#tt-surface .node')].map(n => n.dataset.seq)",
            )
        ]
        assert shown == list(then.nodes)
        now_shown = [
            int(x)
            for x in js(
                driver,
                "return [...document.querySelectorAll('#surface .node')].map(n => n.dataset.seq)",
            )
        ]
        assert now_shown == list(now.nodes)
        assert count(driver, "#tt-surface [data-offloaded]") >= 1
        assert count(driver, "#tt-surface .badge.offload") >= len(then.overrides)
        assert "Surface at seq 40" in text(driver, "#tt-surface")
        diff = text(driver, "#tt-diff")
        assert "asOfSeq" in diff and "40" in diff
        assert count(driver, "#tt-diff tbody tr") > 0

        # --- no secret is rendered: an API key in a header's config is redacted
        with SessionWriter(stack.config) as writer:
            writer.append(
                SECRET_SID,
                "request/header",
                {
                    "header": {"config": {"provider": "p", "model": "m-7", "apiKey": SECRET}},
                    "reason": "initial",
                },
            )
        driver.get(f"{url}#/session/{SECRET_SID}")
        wait_for("the header of the secret session", lambda: "m-7" in text(driver, "#request"))
        assert "[redacted]" in text(driver, "#request")
        assert SECRET not in driver.page_source
        seq_box = driver.find_element(By.ID, "tt-seq")
        seq_box.clear()
        seq_box.send_keys("0")
        driver.find_element(By.ID, "tt-go").click()
        wait_for("time travel of the secret session", lambda: count(driver, "#tt-diff") == 1)
        assert SECRET not in driver.page_source
        for path in (
            f"api/session?id={SECRET_SID}",
            f"api/session/at?id={SECRET_SID}&seq=0",
            f"api/session/surface?id={SECRET_SID}",
            "api/health",
            "api/sessions",
        ):
            body = urllib.request.urlopen(url + path).read()
            assert SECRET.encode() not in body and TOKEN.encode() not in body, path
    except BaseException:
        save_failure_screenshot(driver, "inspector-failure")
        raise
