"""The plans of rule S: what an event does to the surface, decided before it is committed.

:func:`~processor.core.surface.plan_event` yields one of these (pure,
nothing changed); :func:`~processor.core.surface.commit_plan` applies it.
A :class:`Replacement` is one committed replace, kept for G-5.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

# The plans and Replacement are plain classes with read-only (``Final``)
# slots rather than frozen dataclasses: one is built per event, and the
# compiled build leaves a dataclass ``__init__`` interpreted (1.6 us against
# 0.16 us for a native constructor, which also refuses writes to a ``Final``
# attribute at run time); mypy refuses the writes in the source.


class LogOnlyPlan:
    """The event is kept in the log and changes no surface node."""

    __slots__ = ("seq",)

    def __init__(self, seq: int) -> None:
        self.seq: Final = seq

    def __eq__(self, other: object) -> bool:
        return type(other) is LogOnlyPlan and other.seq == self.seq

    def __hash__(self) -> int:
        return hash((LogOnlyPlan, self.seq))

    def __repr__(self) -> str:
        return f"LogOnlyPlan(seq={self.seq!r})"


class AppendPlan:
    __slots__ = ("seq",)

    def __init__(self, seq: int) -> None:
        self.seq: Final = seq

    def __eq__(self, other: object) -> bool:
        return type(other) is AppendPlan and other.seq == self.seq

    def __hash__(self) -> int:
        return hash((AppendPlan, self.seq))

    def __repr__(self) -> str:
        return f"AppendPlan(seq={self.seq!r})"


class ReplacePlan:
    __slots__ = ("end_index", "end_seq", "seq", "shadowed", "start_index", "start_seq")

    def __init__(
        self,
        seq: int,
        start_seq: int,
        end_seq: int,
        start_index: int,
        end_index: int,
        shadowed: tuple[int, ...],
    ) -> None:
        self.seq: Final = seq
        self.start_seq: Final = start_seq
        self.end_seq: Final = end_seq
        self.start_index: Final = start_index
        self.end_index: Final = end_index
        self.shadowed: Final = shadowed

    def _key(self) -> tuple[int, int, int, int, int, tuple[int, ...]]:
        return (
            self.seq,
            self.start_seq,
            self.end_seq,
            self.start_index,
            self.end_index,
            self.shadowed,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplacePlan) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"ReplacePlan(seq={self.seq!r}, start_seq={self.start_seq!r}, "
            f"end_seq={self.end_seq!r}, start_index={self.start_index!r}, "
            f"end_index={self.end_index!r}, shadowed={self.shadowed!r})"
        )


@dataclass(frozen=True, slots=True)
class ProjectPlan:
    seq: int
    projection_type: str
    overrides: Mapping[int, Any]


Plan = LogOnlyPlan | AppendPlan | ReplacePlan | ProjectPlan


class Replacement:
    """One committed replace: the new seq, its endpoints and what it shadowed."""

    __slots__ = ("end_seq", "seq", "shadowed", "start_seq")

    def __init__(self, seq: int, start_seq: int, end_seq: int, shadowed: tuple[int, ...]) -> None:
        self.seq: Final = seq
        self.start_seq: Final = start_seq
        self.end_seq: Final = end_seq
        self.shadowed: Final = shadowed

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Replacement)
            and other.seq == self.seq
            and other.start_seq == self.start_seq
            and other.end_seq == self.end_seq
            and other.shadowed == self.shadowed
        )

    def __hash__(self) -> int:
        return hash((self.seq, self.start_seq, self.end_seq, self.shadowed))

    def __repr__(self) -> str:
        return (
            f"Replacement(seq={self.seq!r}, start_seq={self.start_seq!r}, "
            f"end_seq={self.end_seq!r}, shadowed={self.shadowed!r})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "startSeq": self.start_seq,
            "endSeq": self.end_seq,
            "shadowed": list(self.shadowed),
        }
