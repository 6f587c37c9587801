"""One cell of a session's projections: state, watermark and views (P-1, P-3).

A cell is what :class:`~processor.core.projections.SessionProjections`
keeps per (session, key).  Its views follow the state by identity (P-1): a
view is recomputed only when the state object changed, and validated only
when the view object changed, because deep comparison per event would cost
more than the fold.
"""

from __future__ import annotations

from typing import Any

from processor.core.events import Event
from processor.core.projection_registry import _UNSET, State, _Unit, _validate_view

__all__ = ["_Cell"]


class _Cell:
    """P-3: state, watermark and the last two views of one (session, key)."""

    __slots__ = (
        "definition",
        "observed_seq",
        "pending",
        "prev_view",
        "state",
        "unit",
        "valid_view",
        "view",
        "view_state",
    )

    def __init__(self, unit: _Unit, state: State, observed_seq: int) -> None:
        self.unit = unit
        self.definition = unit.definition
        self.state = state
        self.observed_seq = observed_seq
        # Events queued for ``definition.apply_all`` (see SessionProjections._flush);
        # None when there are none, which is whenever anything reads the cell.
        self.pending: list[Event] | None = None
        self.view_state: Any = _UNSET  # the state object ``view`` was computed from
        self.view: Any = None
        self.prev_view: Any = None
        self.valid_view: Any = _UNSET  # the last view object that passed validation

    def current_view(self) -> Any:
        """P-1: recompute the view only when the state object changed.

        A recomputed view that is the same object as the current one is not
        a change: the previous view is kept as ``prev_view``.
        """
        wire = self.definition.wire
        assert wire is not None
        if self.view_state is not self.state:
            view = wire.view(self.state)
            self.view_state = self.state
            if view is not self.view:
                self.prev_view, self.view = self.view, view
        return self.view

    def validated_view(self) -> Any:
        view = self.current_view()
        if self.valid_view is not view:
            _validate_view(self.definition, view, self.observed_seq)
            self.valid_view = view
        return view
