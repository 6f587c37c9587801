"""Runtime-context and system-prompt projections (docs/session-semantics.md §8, rule R).

Both projections answer one question for the step loop: *which surface
events, if any, must be logged so that the model sees the current prompt and
the current runtime context?*  They never append anything themselves: they
return :class:`EventDraft` values (uncommitted events without seq or time) and
the loop commits them through the :class:`~processor.core.session.Session`
(validate, then append) at the moment the rules allow (R-3).  Because every
model-facing message is a logged event, rebuilding the messages from the log
prefix gives exactly what the adapter received (F-3).

Both follow the runtime's ``SystemPromptProjection`` and
``RuntimeContextProjection`` (its agent loop): they read the surface and the
logged events, never a cache that could drift from the log.

Decisions
---------
* Comparable text is the runtime's: ``""`` for no content, the text of a
  single ``text`` block, otherwise none (:func:`single_text`; such a message
  never counts as already sent).  :func:`message_text` (all text blocks
  concatenated) is kept for display and tests.
* The system *head* is the first system node on the surface (normally node 0).
* A system replacement is a new event of the current step, so it carries the
  loop's current ``turn``/``step`` (passed in by the caller), not the ones of
  the node it rewrites.
* System messages written here carry ``source: {"kind": "system-prompt"}``.
* Message ids come from the caller's ``new_id(kind)`` factory, so the loop
  decides the id scheme (deterministic in tests, anything unique in
  production).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from processor.agent.prompt import RUNTIME_CONTEXT_CLEARED, RenderedContext
from processor.core.events import ABSENT, Event
from processor.core.frozen import freeze
from processor.core.surface import SurfaceState

__all__ = [
    "RUNTIME_CONTEXT_KIND",
    "EventDraft",
    "IdFactory",
    "RetainedContext",
    "RuntimeContextProjection",
    "SystemPromptProjection",
    "message_text",
    "runtime_context_source",
]

RUNTIME_CONTEXT_KIND: Final = "runtime-context"
"""``source.kind`` of the runtime-context messages this projection owns (R-2)."""

IdFactory = Callable[[str], str]
"""``new_id(kind) -> message id``; ``kind`` is e.g. ``"system"`` or ``"user"``."""


@dataclass(frozen=True, slots=True)
class EventDraft:
    """An event that is not in the log yet: no ``seq``, no ``time``.

    Projections return drafts instead of events because projecting is not
    appending (R-3): only the loop decides when (and whether) a draft becomes
    the next event of the session.  The fields mirror the envelope (§0).
    ``data`` is deep-frozen so that a draft handed around before commit cannot
    be edited behind the validator's back.
    """

    type: str
    data: Any
    surface_op: Any = ABSENT
    source_event_seqs: Any = ABSENT
    ignorable: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", freeze(self.data))
        if self.surface_op is not ABSENT:
            object.__setattr__(self, "surface_op", freeze(self.surface_op))
        if self.source_event_seqs is not ABSENT:
            object.__setattr__(self, "source_event_seqs", freeze(self.source_event_seqs))

    @property
    def message(self) -> Any:
        """The message the draft carries (``data`` itself for ``user/message``)."""
        if self.type == "user/message":
            return self.data
        return self.data.get("message") if isinstance(self.data, dict) else None


def message_text(message: Any) -> str:
    """Concatenated text of a message's ``text`` blocks (``""`` for none)."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return ""
    return "".join(
        b["text"]
        for b in content
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    )


def _text_content(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}] if text else []


# --------------------------------------------------------------------- R-1..R-3


def runtime_context_source(rendered: RenderedContext) -> dict[str, Any]:
    """R-2: the typed ``source`` of a runtime-context message.

    With sections the source keeps their names and texts (attribution: which
    contribution said what); the CLEARED marker has no sections, so it is just
    ``{kind}`` — it must not carry contributions that no longer exist.
    """
    if rendered.sections:
        return {
            "kind": RUNTIME_CONTEXT_KIND,
            "form": "snapshot",
            "sections": [{"name": s.name, "text": s.text} for s in rendered.sections],
        }
    return {"kind": RUNTIME_CONTEXT_KIND}


def _is_runtime_context(data: Any) -> bool:
    if not isinstance(data, dict):
        return False
    source = data.get("source")
    return isinstance(source, dict) and source.get("kind") == RUNTIME_CONTEXT_KIND


def single_text(message: Any) -> str | None:
    """The text of a message made of exactly one ``text`` block, else None.

    This is how the runtime reads back its own prompt and context messages:
    a message of any other shape has no comparable text, so it never counts
    as "already sent" and never suppresses a resend.
    """
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list | tuple) and len(content) == 1:
        block = content[0]
        if isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text")
            return text if isinstance(text, str) else None
    return None


@dataclass(frozen=True, slots=True)
class RetainedContext:
    """The runtime-context message the model currently sees: its seq and text."""

    seq: int
    text: str | None


_NEVER: Final = "never"


class RuntimeContextProjection:
    """Sends the runtime context only when it changed (R-1..R-3), as the runtime does.

    Snapshots accumulate in the history as user-role messages, so sending one
    per step would flood the context; sending none after a change would leave
    the model with a stale snapshot.  The projection keeps three states:

    * *never*: no runtime-context message exists in the log -- an empty
      context sends nothing;
    * *none retained* (``retained is None``): one existed but a replacement
      shadowed it -- any context is (re)sent, an empty one as CLEARED (issue
      17 item 4: the model may still hold the compacted summary of the old
      snapshot, so silence would not revoke it);
    * *retained* ``(seq, text)``: the last one sent -- a context whose text
      equals it is not resent.

    :meth:`restore` scans newest-first for runtime-context messages and keeps
    the first one still on the surface, skipping shadowed ones (item 5: an
    older snapshot that survived a compaction with the same text is what the
    model sees, so it is not resent).  :meth:`observe` follows every
    committed event: a runtime-context message becomes retained, a
    replacement citing the retained seq in ``sourceEventSeqs`` drops it.
    """

    __slots__ = ("_retained",)

    def __init__(self) -> None:
        self._retained: RetainedContext | str | None = _NEVER

    @property
    def retained(self) -> RetainedContext | None:
        return self._retained if isinstance(self._retained, RetainedContext) else None

    @property
    def ever_sent(self) -> bool:
        return self._retained != _NEVER

    def restore(self, events: Sequence[Event], surface: SurfaceState) -> None:
        """R-1: the newest runtime-context message still on the surface (older ones included)."""
        self._retained = _NEVER
        for event in reversed(events):
            if event.type != "user/message" or not _is_runtime_context(event.data):
                continue
            if self._retained == _NEVER:
                self._retained = None
            if event.seq in surface.node_events:
                self._retained = RetainedContext(event.seq, single_text(event.data))
                return

    def observe(self, event: Event, surface: SurfaceState) -> None:
        """Follow a committed event (the runtime's ``session/event`` listener)."""
        if event.type == "user/message" and _is_runtime_context(event.data):
            self._retained = RetainedContext(event.seq, single_text(event.data))
            return
        retained = self._retained
        if (
            isinstance(retained, RetainedContext)
            and isinstance(event.surface_op, dict)
            and isinstance(event.source_event_seqs, list | tuple)
            and retained.seq in event.source_event_seqs
        ):
            self._retained = None

    def project(
        self, rendered: RenderedContext, surface: SurfaceState, new_id: IdFactory
    ) -> EventDraft | None:
        """R-1/R-2: the uncommitted runtime-context message of this step, or None."""
        text = rendered.text
        if self._retained == _NEVER and text == "":
            return None
        snapshot = RUNTIME_CONTEXT_CLEARED if text == "" else text
        retained = self._retained
        if isinstance(retained, RetainedContext) and retained.text == snapshot:
            return None
        message = {
            "id": new_id("user"),
            "role": "user",
            "content": [{"type": "text", "text": snapshot}],
            "source": runtime_context_source(rendered),
        }
        return EventDraft("user/message", message, surface_op="append")


# ---------------------------------------------------------------------


class SystemPromptProjection:
    """Admits the rendered system prompt onto the surface (R-4).

    The prompt lives on the surface as ``system/message`` nodes, not in the
    request header, so that the log alone explains what the model was told.
    How a *changed* prompt is admitted depends on the route prepared for this
    very attempt (R-5):

    * a capable route (``inHistory``) continuing its request series gets the
      new prompt appended at the end of the history — earlier turns keep the
      instructions they were answered under and the provider's cached prefix
      stays valid;
    * an incapable route, a new series, or an empty prompt consolidates: every
      later non-empty system node is blanked and the head is rewritten to the
      current text, so exactly one (or no) instruction set remains and an old
      instruction can never resurface.

    The first system node is reserved even when the prompt is empty, so the
    head position is fixed (S-6 protects node 0) and a later prompt can be
    written into it by a replace.
    """

    __slots__ = ("_new_id",)

    def __init__(self, new_id: IdFactory) -> None:
        self._new_id = new_id

    def _system_draft(self, text: str, turn: int, step: int, replace: int | None) -> EventDraft:
        data = {
            "turn": turn,
            "step": step,
            "message": {
                "id": self._new_id("system"),
                "role": "system",
                "content": _text_content(text),
                "source": {"kind": "system-prompt"},
            },
        }
        if replace is None:
            return EventDraft("system/message", data, surface_op="append")
        return EventDraft(
            "system/message",
            data,
            surface_op={"op": "replace", "startSeq": replace, "endSeq": replace},
            source_event_seqs=[replace],
        )

    def project(
        self,
        surface: SurfaceState,
        rendered: str,
        *,
        in_history: bool,
        starts_series: bool,
        turn: int = 0,
        step: int = 0,
    ) -> list[EventDraft]:
        """R-4: the system events to log before this attempt's request.

        ``in_history`` must come from the route prepared for this attempt
        (R-5), never from an older ``request/context`` record: a model switch
        between attempts changes what the route can do.  Each replace targets
        exactly one node and cites it in ``sourceEventSeqs`` (S-4).

        Consolidation blanks the later non-empty nodes first and rewrites the
        head last (issue 17 item 6, the runtime's order): at every point of
        the sequence no instruction set is visible that was not visible
        before, and a reader of a cut-off log never sees the new head next to
        a stale later node.  A node's text is ``""`` when it has no content,
        the text of its single text block, or None (not comparable: it is
        rewritten / never matches).
        """
        system_nodes = [s for s in surface.nodes if surface.node_events[s].type == "system/message"]
        if not system_nodes:
            return [self._system_draft(rendered, turn, step, None)]
        texts: dict[int, str | None] = {}
        for s in system_nodes:
            # the node's own logged message, as the runtime reads it (eventAt)
            data = surface.node_events[s].data
            message = data.get("message") if isinstance(data, dict) else None
            content = message.get("content") if isinstance(message, dict) else None
            texts[s] = (
                "" if isinstance(content, list | tuple) and not content else (single_text(message))
            )
        head, tail = system_nodes[0], system_nodes[1:]
        if not in_history or starts_series or rendered == "":
            drafts = [self._system_draft("", turn, step, s) for s in tail if texts[s] != ""]
            if texts[head] != rendered:
                drafts.append(self._system_draft(rendered, turn, step, head))
            return drafts
        latest = next((s for s in reversed(system_nodes) if texts[s] != ""), head)
        if texts[latest] == rendered:
            return []
        return [self._system_draft(rendered, turn, step, None)]
