"""Fixtures of the inspector tests: a real broker, a processor, the server, Chromium.

Chromium is Debian's ``chromium`` driven through Debian's ``chromium-driver``
by selenium, pointed at both binaries explicitly; ``SE_OFFLINE`` keeps
selenium-manager from looking anything up.  A machine without them fails the
browser tests with a message saying what to install — never a silent skip.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from processor.config import ServiceConfig
from processor.inspect.server import InspectorServer
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics
from processor.service.loop.runner import Processor

CHROMIUM = os.environ.get("PROCESSOR_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PROCESSOR_CHROMEDRIVER", "/usr/bin/chromedriver")
TOKEN = "tok-3f9a-inspector-test"


def missing_browser(chromium: str = CHROMIUM, driver: str = CHROMEDRIVER) -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    for path, package in ((chromium, "chromium"), (driver, "chromium-driver")):
        if not (Path(path).is_file() and os.access(path, os.X_OK)):
            return (
                f"{path} not found: the inspector's browser tests need Debian's `chromium` "
                f"and `chromium-driver` (apt-get install -y chromium chromium-driver; "
                f"scripts/test.sh installs them in CI) — missing package: {package}"
            )
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    return None


@pytest.fixture(scope="session")
def chrome() -> Iterator[Any]:
    problem = missing_browser()
    if problem:
        pytest.fail(problem, pytrace=False)
    os.environ.setdefault("SE_OFFLINE", "true")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--disable-extensions",
        "--no-first-run",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@dataclass
class InspectStack:
    config: ServiceConfig
    processor: Processor
    thread: threading.Thread
    server: InspectorServer


_counter = iter(range(1_000_000))


@pytest.fixture
def inspect_stack(kafka_bootstrap: str) -> Iterator[InspectStack]:
    """Topics, one processor member (views split into 256-byte parts) and the inspector."""
    prefix = f"i{os.getpid()}x{next(_counter)}x{int(time.time() * 1000) % 100000}"
    config = ServiceConfig(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=prefix,
        group_id=f"{prefix}-group",
        partitions=3,
        commit_interval_ms=100,
        transaction_timeout_ms=10_000,
        max_view_bytes=256,
        transcript_page_size=8,
    )
    create_topics(clients.admin(config), config)
    proc = Processor(config)
    thread = threading.Thread(target=proc.run, name="processor", daemon=True)
    thread.start()
    server = InspectorServer(config, port=0, token=TOKEN).start()
    try:
        yield InspectStack(config, proc, thread, server)
    finally:
        server.stop()
        proc.stop()
        thread.join(60)


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float = 90.0,
    on_timeout: Callable[[], None] | None = None,
) -> Any:
    """Poll ``check`` until it returns a truthy value (generous deadline, no tight sleeps)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # the page is mid-render: try again
            last_error = exc
        time.sleep(0.25)
    if on_timeout is not None:
        on_timeout()
    raise AssertionError(
        f"timed out waiting for {what}" + (f" (last error: {last_error})" if last_error else "")
    )


def save_failure_screenshot(driver: Any, name: str) -> None:
    out = Path(os.environ.get("PROCESSOR_TEST_ARTIFACTS", "/tmp")) / f"{name}.png"
    try:
        driver.save_screenshot(str(out))
        print(f"screenshot of the failing page: {out}")
    except Exception:  # the browser itself is gone: nothing to keep
        pass


def have(cmd: str) -> bool:
    return shutil.which(cmd) is not None
