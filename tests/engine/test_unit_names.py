"""Unit keys are wire names: registration refuses the service's own (P-2).

A unit's key is the name of its view record (``<session>/<key>``) and of its
checkpoint part (``u.<key>``).  A unit named ``~h`` would overwrite the
parted views head; one named ``messages`` would be read as the core view.
"""

from __future__ import annotations

import pytest

from processor.core.builtin import default_registry
from processor.core.errors import ProjectionError
from processor.core.projection_registry import ProjectionDefinition, WireView


def unit(key: str) -> ProjectionDefinition:
    return ProjectionDefinition(
        key=key,
        state_version=0,
        init=lambda header, inherited: 0,
        apply=lambda state, event: state,
        validate_state=lambda state: None,
        wire=WireView(view=lambda state: state, validate_view=lambda view: None),
    )


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("~h", "parted view records"),
        ("~custom", "parted view records"),
        ("messages", "core view"),
        ("status", "core view"),
        ("transcript.3", "core view"),
        ("a\x00b", "NUL byte"),
        # views keys are <session>/<name>[#<part>]: unit x#1 would be part 1 of x,
        # and a tombstone's key could not be mapped back (docs/views-format.md)
        ("x#1", "delimit the session, the name and the part"),
        ("team/unit", "delimit the session, the name and the part"),
    ],
)
def test_P2_a_unit_whose_key_is_a_reserved_view_name_is_refused(key: str, why: str) -> None:
    registry = default_registry()
    before = registry.definitions()
    with pytest.raises(ProjectionError) as info:
        registry.register(unit(key))
    assert info.value.rule == "P-2" and why in str(info.value)
    assert str(info.value).startswith(f"session: projection key {key!r} is reserved: ")
    assert registry.definitions() == before


def test_P2_ordinary_unit_keys_still_register() -> None:
    registry = default_registry()
    for key in ("stats~", "my.transcript", "messagesCount", "team.unit", "a-b_c:d"):
        registry.register(unit(key))
        assert key in registry


def test_a_released_unit_is_tombstoned_once() -> None:
    """Unit views follow the registry's key set: a released unit's view record is
    tombstoned in the next batch, once (runtime.py skips the scan while the
    registry's generation holds)."""
    from tests.engine.kit import Harness, session_log

    h = Harness()
    events = session_log(8)
    reg = h.engine.registry.register(unit("extra"))
    key = b"s/extra"

    def batch(i: int) -> list[tuple[bytes | None, bool]]:
        h.fold_events("s", [events[i]])
        return [(o.key, o.value is None) for o in h.commit() if o.key == key]

    assert batch(0) == [(key, False)]  # published
    assert batch(1) == []  # unchanged value (0): nothing
    reg.release()
    assert batch(2) == [(key, True)]  # tombstoned
    assert batch(3) == []  # once
    assert batch(4) == []
