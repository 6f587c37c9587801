"""The compact model stream the runtime embeds in ``assistant/*`` events.

The runtime logs every model attempt with the exact stream its adapter
produced (``stream``: a list of compact records), on ``assistant/message``
(success) and ``assistant/attempt`` (failure); a log without it is not one
the runtime writes (and its loader refuses an ``assistant/*`` event whose
``stream`` is not a list).  Our adapters return finished results, so the loop
writes the stream an adapter emitting those results chunk by chunk would
have produced: per content block a ``block-start`` chunk, one delta run
(``text-chunks`` / ``reasoning-chunks`` / ``tool-call-chunks``) when the
block has streamable text, and a ``block-end`` chunk carrying the block; then
a ``usage`` chunk and the terminal ``finish`` chunk.  Replaying it through
the runtime's assembler yields the logged message content and usage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["failure_stream", "reply_stream"]


def _chunk(time: int, chunk: dict[str, Any]) -> dict[str, Any]:
    return {"type": "chunk", "time": time, "chunk": chunk}


def _block_records(time: int, index: int, block: Mapping[str, Any]) -> list[dict[str, Any]]:
    kind = block.get("type")
    records = [_chunk(time, {"type": "block-start", "index": index, "blockType": kind})]
    if kind in ("text", "reasoning") and isinstance(block.get("text"), str) and block["text"]:
        records.append(
            {
                "type": f"{kind}-chunks",
                "time0": time,
                "index": index,
                "dt": [],
                "texts": [block["text"]],
            }
        )
    elif kind == "tool-call" and isinstance(block.get("id"), str) and block["id"]:
        records.append(
            {
                "type": "tool-call-chunks",
                "time0": time,
                "index": index,
                "dt": [],
                "id": block["id"],
                "name": block.get("name"),
                "args": [block.get("arguments", "")],
            }
        )
    records.append(_chunk(time, {"type": "block-end", "index": index, "block": dict(block)}))
    return records


def reply_stream(
    time: int, content: Sequence[Mapping[str, Any]], usage: Mapping[str, Any] | None, finish: str
) -> list[dict[str, Any]]:
    """Stream records of a successful attempt (``finish``: stop, tool-calls, max-tokens)."""
    records: list[dict[str, Any]] = []
    for index, block in enumerate(content):
        records.extend(_block_records(time, index, block))
    if usage is not None:
        records.append(_chunk(time, {"type": "usage", "usage": dict(usage)}))
    records.append(_chunk(time, {"type": "finish", "reason": {"kind": finish}}))
    return records


def failure_stream(time: int, code: str, message: str) -> list[dict[str, Any]]:
    """Stream records of a failed attempt: the terminal ``error`` finish only."""
    return [
        _chunk(
            time,
            {
                "type": "finish",
                "reason": {"kind": "error", "failure": {"message": message, "code": code}},
            },
        )
    ]
