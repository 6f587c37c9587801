"""A session with the default registries, from one place (core/defaults.py)."""

from __future__ import annotations

import random

from processor.core.builtin import default_registry
from processor.core.defaults import (
    default_message_projections,
    fold_session,
    new_session,
    session_from_checkpoint,
)
from processor.core.projections import ProjectionRegistry
from processor.workload import generate_session


def _keys(registry: ProjectionRegistry) -> list[str]:
    return sorted(d.key for d in registry.definitions())


def test_every_entry_point_folds_with_the_built_in_units_and_interpreters() -> None:
    log = generate_session(random.Random(3), 40)
    want = _keys(default_registry())
    assert want  # the built-in units exist
    live = new_session()
    for event in log:
        live.append(event)
    folded = fold_session(log)
    restored = session_from_checkpoint(folded.checkpoint())
    for session in (live, folded, restored):
        assert _keys(session.projections.registry) == want
        registry = session.surface.message_projections
        assert registry is not None
        assert registry.types() == default_message_projections().types() == {"image/offload"}
    assert live.derive_messages() == folded.derive_messages() == restored.derive_messages()
    assert live.projections.snapshot().values == folded.projections.snapshot().values


def test_explicit_registries_replace_the_defaults() -> None:
    empty = ProjectionRegistry()
    session = fold_session(generate_session(random.Random(3), 10), projections=empty)
    assert _keys(session.projections.registry) == []
