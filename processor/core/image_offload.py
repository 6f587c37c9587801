"""The built-in ``image/offload`` message projection (M-5).

Large inline images are moved out of the model context once they have been
stored elsewhere.  The event is durable, so any reader of the log reaches the
same messages.

Payload (``data``)::

    {"images": [{"seq": S, "index": I, "uri": "s3://...", "mediaType"?: str}, ...]}

Each entry names the content block ``I`` of the message at surface node ``S``;
that block must currently be ``{"type": "image", ...}``.  It is replaced by
``{"type": "image-ref", "uri": uri, "mediaType"?: ...}`` (mediaType from the
entry, else from the original block when it had one).  Several entries may
target one message.  The whole payload is validated before anything is
returned: one bad entry rejects the event and nothing is projected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from processor.core.errors import SessionError
from processor.core.events import Event
from processor.core.frozen import FrozenDict, FrozenList, freeze
from processor.core.message_projections import ProjectionContext

_ENTRY_KEYS = frozenset({"seq", "index", "uri", "mediaType"})


class ImageOffload:
    """Replace inline image blocks of earlier messages with references."""

    type = "image/offload"

    def project(self, event: Event, ctx: ProjectionContext) -> Mapping[int, Any]:
        seq = event.seq
        data = event.data
        images = data.get("images") if isinstance(data, dict) else None
        if not isinstance(images, list) or not images:
            raise SessionError(seq, "M-5", "image/offload data.images must be a non-empty list")
        node_set = set(ctx.nodes)
        edits: dict[int, dict[int, dict[str, Any]]] = {}
        for n, entry in enumerate(images):
            where = f"image/offload images[{n}]"
            if not isinstance(entry, dict) or not {"seq", "index", "uri"} <= set(entry):
                raise SessionError(seq, "M-5", f"{where} needs seq, index and uri")
            if set(entry) - _ENTRY_KEYS:
                raise SessionError(
                    seq, "M-5", f"{where} has unknown keys {sorted(set(entry) - _ENTRY_KEYS)}"
                )
            target, index, uri = entry["seq"], entry["index"], entry["uri"]
            if not isinstance(uri, str) or not uri:
                raise SessionError(seq, "M-5", f"{where}.uri must be a non-empty string")
            if "mediaType" in entry and not isinstance(entry["mediaType"], str):
                raise SessionError(seq, "M-5", f"{where}.mediaType must be a string")
            if type(target) is not int or target not in node_set:
                raise SessionError(seq, "M-5", f"{where}.seq {target!r} is not a surface node")
            message = ctx.message_of(target)
            content = message.get("content") if isinstance(message, dict) else None
            if type(index) is not int or not isinstance(content, list) or not (
                0 <= index < len(content)
            ):
                raise SessionError(seq, "M-5", f"{where}.index {index!r} is not a content block")
            block = content[index]
            if not isinstance(block, dict) or block.get("type") != "image":
                raise SessionError(
                    seq, "M-5", f"{where}: block {index} of seq {target} is not an image"
                )
            if index in edits.get(target, {}):
                raise SessionError(seq, "M-5", f"{where} repeats block {index} of seq {target}")
            ref: dict[str, Any] = {"type": "image-ref", "uri": uri}
            media = entry.get("mediaType", block.get("mediaType"))
            if media is not None:
                ref["mediaType"] = media
            edits.setdefault(target, {})[index] = ref
        out: dict[int, Any] = {}
        for target, blocks in edits.items():
            message = ctx.message_of(target)
            content = FrozenList(
                [freeze(blocks[i]) if i in blocks else b for i, b in enumerate(message["content"])]
            )
            out[target] = FrozenDict({**message, "content": content})
        return out
