"""Test-wide settings.

Members started by the tests (in-process configs and ``processor run``
children alike) keep their local stores in one temporary directory, removed
at the end, instead of ``./state`` in the checkout.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_STATE = tempfile.mkdtemp(prefix="processor-tests-state-")
os.environ.setdefault("PROCESSOR_STATE_DIR", _STATE)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_STATE, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's ``--dist loadgroup`` (scripts/test.sh): the tests of
    one file run in one worker, so a module's fixtures (a built wheel, a
    started member) are set up once, and the fault suite's tests all run in
    one worker, so one local cluster serves them."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = "faults" if item.get_closest_marker("faults") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
