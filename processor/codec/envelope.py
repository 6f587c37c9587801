"""The event envelope as a ``SessionEvent`` Avro datum, and back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from processor.codec.decoded import DecodedEvent
from processor.codec.names import (
    _ENVELOPE_KEYS,
    _INT_MAX,
    _INT_MIN,
    _LONG_MAX,
    _LONG_MIN,
    _OPAQUE,
    _REPLACE_OP,
    CodecError,
)
from processor.codec.payload import (
    _dumps,
)
from processor.core.errors import raised_from, without_addresses
from processor.core.events import SHARED_STRINGS as SHARED_STRINGS  # tests read it here
from processor.core.frozen import json_problem

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


def _json_text(value: Any, what: str) -> str:
    return _dumps(value, what).decode()


def _is_long(value: Any) -> bool:
    return type(value) is int and _LONG_MIN <= value <= _LONG_MAX


def _is_seq(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _LONG_MAX


def _surface_op_datum(op: Any) -> Any:
    if op == "append" and isinstance(op, str):
        return ("string", "append")
    if isinstance(op, dict) and len(op) == 3 and op.get("op") == "replace":
        start, end = op.get("startSeq"), op.get("endSeq")
        if _is_seq(start) and _is_seq(end) and isinstance(op["op"], str):
            return (_REPLACE_OP, {"op": "replace", "startSeq": start, "endSeq": end})
    return (_OPAQUE, {"json": _json_text(op, "surfaceOp")})


def _source_seqs_datum(seqs: Any) -> Any:
    if isinstance(seqs, list) and all(_is_long(s) for s in seqs):
        # fastavro's tuple notation wants an exact list (not FrozenList)
        return ("array", seqs if type(seqs) is list else list(seqs))
    return (_OPAQUE, {"json": _json_text(seqs, "sourceEventSeqs")})


def _ignorable_datum(flag: Any) -> Any:
    if flag is True or flag is False:
        return ("boolean", flag)
    return (_OPAQUE, {"json": _json_text(flag, "ignorable")})


def _check_ints(record: str, **fields: int) -> None:
    """Avro ``int`` fields: fastavro would silently write any Python int."""
    for name, value in fields.items():
        if type(value) is not int or not _INT_MIN <= value <= _INT_MAX:
            raise CodecError(f"cannot encode {record}: {name} must be a 32-bit int, got {value!r}")


def _check_plain(value: Any, what: str) -> None:
    problem = json_problem(value, what)
    if problem:
        raise CodecError(f"{problem}; envelope values must be plain JSON")


def _event_datum(
    session_id: str,
    envelope: Mapping[str, Any],
    data_text: str | None,
    producer: str | None,
    trusted: bool,
) -> dict[str, Any]:
    if not isinstance(envelope, Mapping):
        raise CodecError("event envelope must be a JSON object")
    if not isinstance(session_id, str):
        raise CodecError("session id must be a string")
    try:
        etype = envelope["type"]
        seq = envelope["seq"]
        time = envelope["time"]
        data = envelope["data"]
    except KeyError as exc:
        raise raised_from(CodecError(f"event envelope is missing {exc.args[0]!r}"), None) from None
    n = len(envelope)
    if n > 4 and not _ENVELOPE_KEYS.issuperset(envelope):
        extra = sorted(str(k) for k in envelope if k not in _ENVELOPE_KEYS)
        raise CodecError(f"envelope key(s) {', '.join(extra)} cannot be carried by SessionEvent")
    if not isinstance(etype, str):
        raise CodecError(f"envelope type must be a string, got {type(etype).__name__}")
    if not _is_long(seq):
        raise CodecError(f"envelope seq must be an integer within Avro long, got {seq!r}")
    if not _is_long(time):
        raise CodecError(f"envelope time must be an integer within Avro long, got {time!r}")
    if data_text is None:
        raw = _dumps(data, "data")
        # orjson writes NaN/Infinity as null: a lossy round trip is the cheap
        # tell-tale, json_problem then says what is wrong (tuples are fine).
        if not trusted and _loads(raw) != data:
            _check_plain(data, "data")
        data_text = raw.decode()
    elif not trusted:
        try:
            _loads(data_text)
        except _JSONDecodeError as exc:
            raise raised_from(
                CodecError(f"data_text is not valid JSON: {without_addresses(str(exc))}"), exc
            ) from exc
    op = seqs = flag = None
    if n > 4:
        if not trusted:
            for key in ("surfaceOp", "sourceEventSeqs", "ignorable"):
                if key in envelope:
                    _check_plain(envelope[key], key)
        if "surfaceOp" in envelope:
            op = _surface_op_datum(envelope["surfaceOp"])
        if "sourceEventSeqs" in envelope:
            seqs = _source_seqs_datum(envelope["sourceEventSeqs"])
        if "ignorable" in envelope:
            flag = _ignorable_datum(envelope["ignorable"])
    return {
        "sessionId": session_id,
        "type": etype,
        "seq": seq,
        "time": time,
        "data": data_text,
        "surfaceOp": op,
        "sourceEventSeqs": seqs,
        "ignorable": flag,
        "producer": producer,
    }


_SHARED: Final[dict[str, str]] = SHARED_STRINGS.values  # read inline per event


def shared_string(value: Any) -> Any:
    """The shared copy of a known event type or "append"; anything else as it is."""
    return _SHARED.get(value, value) if type(value) is str else value


def _opaque(value: dict[str, Any]) -> Any:
    try:
        return _loads(value["json"])
    except _JSONDecodeError as exc:
        raise raised_from(
            CodecError(f"OpaqueJson is not valid JSON: {without_addresses(str(exc))}"), exc
        ) from exc


def _event_from_record(rec: dict[str, Any]) -> DecodedEvent:
    """A ``SessionEvent`` datum (fastavro's dict) as a decoded event."""
    return event_from_fields(
        rec["sessionId"],
        rec["type"],
        rec["seq"],
        rec["time"],
        rec["data"],
        rec["surfaceOp"],
        rec["sourceEventSeqs"],
        rec["ignorable"],
        rec.get("producer"),
    )


def event_from_fields(
    session_id: str,
    etype: Any,
    seq: Any,
    time: Any,
    data_text: Any,
    op: Any,
    seqs: Any,
    flag: Any,
    producer: str | None,
) -> DecodedEvent:
    """A decoded event from a ``SessionEvent``'s fields (schema order)."""
    try:
        data = _loads(data_text)
    except _JSONDecodeError as exc:
        raise raised_from(
            CodecError(f"SessionEvent.data is not valid JSON: {without_addresses(str(exc))}"), exc
        ) from exc
    envelope: dict[str, Any] = {
        # shared: a held session keeps its events, and a copy of "message" or
        # "append" per event was ~0.5 KB of each 12-event session (figure 6)
        "type": _SHARED.get(etype, etype) if type(etype) is str else etype,  # shared_string
        "seq": seq,
        "time": time,
        "data": data,
    }
    if op is not None:
        shared = _opaque(op) if type(op) is dict and "json" in op else shared_string(op)
        envelope["surfaceOp"] = shared
    if seqs is not None:
        envelope["sourceEventSeqs"] = _opaque(seqs) if type(seqs) is dict else seqs
    if flag is not None:
        envelope["ignorable"] = _opaque(flag) if type(flag) is dict else flag
    return DecodedEvent(session_id, envelope, data_text, producer)
