"""The engine's per-record classes (Record, Out, Outcome) keep the dataclass
behaviour the loop and the tests rely on (field equality, repr, unhashable, no
per-instance dict) while being plain classes whose ``__init__`` the compiled
build compiles (a dataclass's generated ``__init__`` stays interpreted)."""

from __future__ import annotations

import types

import pytest

import processor.engine.records as records
from processor.engine.records import Fate, Out, Outcome, Record

COMPILED = not str(records.__file__).endswith(".py")


def test_record_equality_and_repr_are_by_field() -> None:
    rec = Record("events", 1, 2, b"k", None, 3)
    assert rec == Record("events", 1, 2, b"k", None, 3)
    assert rec != Record("events", 1, 2, b"k", b"", 3)
    assert rec != ("events", 1, 2, b"k", None, 3)
    assert repr(rec) == (
        "Record(topic='events', partition=1, offset=2, key=b'k', value=None, timestamp=3)"
    )


def test_out_equality_and_repr_are_by_field() -> None:
    out = Out("views", 0, b"k", None)
    assert out == Out("views", 0, b"k", None)
    assert out != Out("views", 1, b"k", None)
    assert repr(out) == "Out(topic='views', partition=0, key=b'k', value=None)"


def test_outcome_defaults_equality_and_repr() -> None:
    outcome = Outcome(Fate.APPLIED, "s")
    assert (outcome.seq, outcome.rule, outcome.reason) == (None, None, None)
    assert outcome == Outcome(Fate.APPLIED, "s", None, None, None)
    assert outcome != Outcome(Fate.DUPLICATE, "s")
    assert repr(Outcome(Fate.REJECTED, None, 3, "E-1", "why")) == (
        "Outcome(fate=<Fate.REJECTED: 'rejected'>, session_id=None, seq=3, "
        "rule='E-1', reason='why')"
    )


@pytest.mark.parametrize(
    "value",
    [Record("t", 0, 0, None, None, 0), Out("t", 0, None, None), Outcome(Fate.APPLIED, None)],
)
def test_records_are_unhashable_and_hold_no_dict(value: object) -> None:
    with pytest.raises(TypeError):
        hash(value)
    assert not hasattr(value, "__dict__")


@pytest.mark.skipif(not COMPILED, reason="needs the compiled build")
@pytest.mark.parametrize("cls", [Record, Out, Outcome])
def test_compiled_records_construct_natively(cls: type) -> None:
    # a dataclass's generated __init__ is a Python function even in the compiled build
    assert not isinstance(vars(cls)["__init__"], types.FunctionType)
