"""What decoding a ``SessionEvent`` returns (compiled: one per consumed event)."""

from __future__ import annotations

from typing import Any

from processor.core.events import Event, parse_event, parse_event_owned


class DecodedEvent:
    """A decoded ``SessionEvent``, read-only.

    ``envelope`` is the camelCase JSON envelope (plain dicts/lists, ``data``
    decoded by orjson); ``data_text`` is the exact ``data`` JSON text the
    writer produced; ``producer`` is the v2 field (``None`` for v1 records).

    A plain class, not a frozen dataclass: the compiled build runs a
    dataclass's generated ``__init__`` interpreted, and the engine's
    :meth:`to_event` call was an interpreted frame per event too.  Equality and
    ``repr`` are the dataclass's; the fields are properties, so assigning one
    raises ``AttributeError`` as the frozen dataclass did.
    """

    __slots__ = ("_data_text", "_envelope", "_producer", "_session_id")

    def __init__(
        self,
        session_id: str,
        envelope: dict[str, Any],
        data_text: str,
        producer: str | None = None,
    ) -> None:
        self._session_id = session_id
        self._envelope = envelope
        self._data_text = data_text
        self._producer = producer

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def envelope(self) -> dict[str, Any]:
        return self._envelope

    @property
    def data_text(self) -> str:
        return self._data_text

    @property
    def producer(self) -> str | None:
        return self._producer

    @property
    def seq(self) -> int:
        seq: int = self._envelope["seq"]
        return seq

    def to_event(self) -> Event:
        """Validate into a core :class:`Event` (raises ``SessionError``)."""
        return parse_event(self._envelope, trusted_json=True)

    def take_event(self) -> Event:
        """:meth:`to_event` for the one caller that folds it (the engine).

        Compiled, the envelope's ``data`` becomes the event's frozen data in
        place instead of being copied (``envelope["data"]`` is the event's
        afterwards: the same value, frozen).
        """
        return parse_event_owned(self._envelope)

    def _fields(self) -> tuple[str, dict[str, Any], str, str | None]:
        return (self._session_id, self._envelope, self._data_text, self._producer)

    def __eq__(self, other: object) -> bool:
        if type(other) is not DecodedEvent:
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # a dict field: unhashable, as the dataclass

    def __repr__(self) -> str:
        return (
            f"DecodedEvent(session_id={self._session_id!r}, envelope={self._envelope!r}, "
            f"data_text={self._data_text!r}, producer={self._producer!r})"
        )
