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
