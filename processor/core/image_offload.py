"""The built-in ``image/offload`` message projection (M-5).

The payload is the runtime's image-offload plugin's (``dsh-compaction-image-
offload``): when a request exceeds a route's image budget the plugin records
which input images are permanently omitted from later requests::

    {"targets": [{"seq": S, "imageIndexes": [i, j, ...]}, ...]}

``data`` has exactly that one key and a non-empty list; every target has
exactly ``seq`` and a non-empty ``imageIndexes``.  ``seq`` names a current
surface node holding a ``user/message`` or ``tool/result`` (at most once per
event); the indexes are strictly increasing non-negative safe integers that
count the message's image blocks depth-first (into ``tool-result`` blocks of a
v3-form tool result as well) including images already offloaded.  Each
selected image block gains ``"offloaded": true``; an index that does not exist
or names an image already offloaded refuses the whole event.  Message identity
and node membership never change, and nothing is returned before the whole
payload is validated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from processor.core.errors import SessionError
from processor.core.events import Event, is_seq
from processor.core.frozen import FrozenDict, FrozenList
from processor.core.message_projections import ProjectionContext

_TARGET_TYPES = frozenset({"user/message", "tool/result"})


def _is_index(value: Any) -> bool:
    # a JSON number: ``3.0`` is the integer 3 to the runtime (its JSON.parse)
    return is_seq(value)


class _Offloader:
    """Walks one message's blocks depth-first and marks the selected images."""

    def __init__(self, seq: int, indexes: list[int]) -> None:
        self.seq = seq
        self.indexes = indexes
        self.image = 0
        self.selected = 0

    def visit(self, blocks: Any) -> Any:
        out: list[Any] | None = None
        for i, block in enumerate(blocks):
            new = block
            if isinstance(block, dict) and block.get("type") == "image":
                if self.selected < len(self.indexes) and self.image == self.indexes[self.selected]:
                    if block.get("offloaded") is True:
                        raise SessionError(
                            self.seq,
                            "M-5",
                            f"image/offload: image index {self.image} is already offloaded",
                        )
                    new = FrozenDict({**block, "offloaded": True})
                    self.selected += 1
                self.image += 1
            elif (
                isinstance(block, dict)
                and block.get("type") == "tool-result"
                and isinstance(block.get("content"), list)
            ):
                inner = self.visit(block["content"])
                if inner is not block["content"]:
                    new = FrozenDict({**block, "content": inner})
            if new is not block and out is None:
                out = list(blocks[:i])
            if out is not None:
                out.append(new)
        return FrozenList(out) if out is not None else blocks


class ImageOffload:
    """Mark selected image blocks of earlier messages as offloaded."""

    type = "image/offload"

    def project(self, event: Event, ctx: ProjectionContext) -> Mapping[int, Any]:
        seq = event.seq
        data = event.data
        targets = data.get("targets") if isinstance(data, dict) else None
        if (
            not isinstance(data, dict)
            or len(data) != 1
            or not isinstance(targets, list)
            or (not targets)
        ):
            raise SessionError(
                seq, "M-5", "image/offload: data must contain a nonempty targets array"
            )
        # a scan per target (one or two) instead of a set of every node per event
        nodes = ctx.nodes
        out: dict[int, Any] = {}
        for target in targets:
            if (
                not isinstance(target, dict)
                or len(target) != 2
                or not _is_index(target.get("seq"))
                or not isinstance(target.get("imageIndexes"), list)
                or not target["imageIndexes"]
            ):
                raise SessionError(
                    seq,
                    "M-5",
                    "image/offload: each target must contain a seq and nonempty imageIndexes",
                )
            tseq = int(target["seq"])
            if tseq in out:
                raise SessionError(seq, "M-5", f"image/offload: duplicate target seq {tseq}")
            if tseq not in nodes:
                raise SessionError(
                    seq, "M-5", f"image/offload: target seq {tseq} is not a current surface node"
                )
            source = ctx.event_of(tseq)
            if source is None or source.type not in _TARGET_TYPES:
                raise SessionError(
                    seq,
                    "M-5",
                    f"image/offload: target seq {tseq} must be user/message or tool/result",
                )
            indexes = target["imageIndexes"]
            previous = -1
            for index in indexes:
                if not _is_index(index) or int(index) <= previous:
                    raise SessionError(
                        seq,
                        "M-5",
                        "image/offload: imageIndexes must be strictly increasing "
                        "non-negative safe integers",
                    )
                previous = int(index)
            message = ctx.message_of(tseq)
            walker = _Offloader(seq, [int(i) for i in indexes])
            content = walker.visit(message["content"])
            if walker.selected != len(indexes):
                raise SessionError(
                    seq,
                    "M-5",
                    f"image/offload: image index {indexes[walker.selected]} does "
                    f"not exist in seq {tseq}",
                )
            out[tseq] = FrozenDict({**message, "content": content})
        return out
