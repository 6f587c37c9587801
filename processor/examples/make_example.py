"""Scripted agent sessions: the example log, the acceptance scripts, demo sessions.

Everything here drives the reference :class:`~processor.agent.loop.StepLoop`
with the deterministic :class:`~processor.agent.adapters.mock.MockModelAdapter`,
so every log is what a real agent run would write (and valid input for
``processor fold``).

* :class:`TurnScript` / :func:`run_script` — run a list of turns, each with
  optional prompt, runtime-context, tool and config changes and the model's
  scripted answers; returns the session, its events and every request the
  adapter received.
* :func:`random_script` — a random but sensible script (property tests).
* :func:`scripted_sessions` — ``n`` sessions ``(session id, events)`` for the
  demo and benches; pass ``sink`` to :func:`run_script` to stream events live.
* :func:`example_session` / ``python -m processor.examples.make_example`` —
  regenerate ``processor/examples/session.jsonl``, which holds every event
  type the step loop writes (docs/session-semantics.md §1), ``session/end-seed``,
  ``image/offload`` and one ignorable unknown event, in the runtime's newest
  format (v4 header and shapes).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from processor.agent.adapters.mock import (
    Fail,
    MaxTokens,
    MockModelAdapter,
    MockRoute,
    Overflow,
    Say,
    ScriptItem,
    ToolCall,
)
from processor.agent.context import EventDraft
from processor.agent.loop import Agent, CompactionPlugin, LogicalClock, StepLoop
from processor.agent.prompt import ContextSection, Registration, Section, ToolSpec
from processor.agent.request import Request
from processor.core.events import Event
from processor.core.log import SessionHeader
from processor.core.session import Session

__all__ = [
    "EXAMPLE_PATH",
    "ROUTES",
    "TOOLS",
    "ScriptedRun",
    "ScriptedSession",
    "TurnScript",
    "example_session",
    "main",
    "random_script",
    "run_script",
    "scripted_sessions",
    "session_header",
]

EXAMPLE_PATH = Path(__file__).with_name("session.jsonl")

ROUTES: Mapping[str, MockRoute] = {
    "default": MockRoute(),
    # same provider and model, but it can neither take in-history system
    # prompts nor tool updates: prompt changes consolidate, tool changes
    # start a new series
    "incapable": MockRoute(in_history_system_prompt=False, tool_updates=False),
    # another model (a route switch: new header, new series)
    "other": MockRoute(model="mock-2", context_window=32_000),
}

TOOLS: Mapping[str, ToolSpec] = {
    "read": ToolSpec(
        "read",
        "Read a file.",
        {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    ),
    "grep": ToolSpec(
        "grep",
        "Search files for a pattern.",
        {"type": "object", "properties": {"pattern": {"type": "string"}}},
    ),
    "edit": ToolSpec(
        "edit",
        "Replace text in a file.",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old": {"type": "string"},
                "new": {"type": "string"},
            },
        },
    ),
    "shell": ToolSpec(
        "shell",
        "Run a shell command.",
        {"type": "object", "properties": {"cmd": {"type": "string"}}},
    ),
}


def _tool_handler(name: str) -> Callable[[Any, Any], str]:
    def handle(arguments: Any, _ctx: Any) -> str:
        return f"{name} ok: {sorted(arguments.items()) if isinstance(arguments, dict) else ''}"

    return handle


@dataclass(frozen=True)
class TurnScript:
    """One scripted turn.

    ``prompt`` / ``context`` replace the system-prompt / runtime-context text
    before the turn (``None``: unchanged; ``""``: empty).  ``add_tools`` /
    ``remove_tools`` name entries of :data:`TOOLS`.  ``config`` updates the
    agent's requested model config.  ``items`` are the model's answers, one
    per attempt (a leftover is dropped after the turn; a missing one is
    answered with ``Say("done")``).  ``splice`` messages are put in the inbox
    for the next turn after this one ended.
    """

    inputs: tuple[str | Mapping[str, Any], ...] = ("hello",)
    items: tuple[ScriptItem, ...] = (Say("ok"),)
    prompt: str | None = None
    context: str | None = None
    add_tools: tuple[str, ...] = ()
    remove_tools: tuple[str, ...] = ()
    config: Mapping[str, Any] | None = None
    splice: tuple[str, ...] = ()


@dataclass
class ScriptedRun:
    """A running scripted agent: its loop, session and adapter."""

    agent: Agent
    session: Session
    adapter: MockModelAdapter
    loop: StepLoop
    texts: dict[str, str] = field(default_factory=dict)
    tools: dict[str, Registration] = field(default_factory=dict)

    @property
    def events(self) -> list[Event]:
        return list(self.session.log)

    @property
    def requests(self) -> list[Request]:
        return self.adapter.requests

    def play(self, turn: TurnScript) -> None:
        """Apply the turn's changes, run it, then splice its inbox messages."""
        if turn.prompt is not None:
            self.texts["prompt"] = turn.prompt
        if turn.context is not None:
            self.texts["context"] = turn.context
        for name in turn.add_tools:
            if name not in self.tools:
                self.tools[name] = self.agent.add_tool(TOOLS[name], _tool_handler(name))
        for name in turn.remove_tools:
            reg = self.tools.pop(name, None)
            if reg is not None:
                reg.remove()
        if turn.config is not None:
            self.agent.config.update(turn.config)
        self.adapter.script = list(turn.items)
        self.loop.run_turn(*turn.inputs)
        self.adapter.script.clear()
        if turn.splice:
            self.loop.splice(*turn.splice, delivery="next-turn")

    def resume(self) -> StepLoop:
        """Start a new loop over the same session (its first header is ``resume``)."""
        self.loop = StepLoop(
            self.agent,
            self.session,
            self.adapter,
            sink=self.loop.sink,
            clock=self.loop.clock,
            plugins=self.loop.plugins,
        )
        return self.loop


def session_header(
    session_id: str, *, seeded: bool = False, parent: str | None = None
) -> SessionHeader:
    """A §11 session header line for a scripted session (the newest format version).

    The step loop writes the runtime's newest shapes (format v4: tool-role tool
    results, producer-owned message sources), so the file says so.
    """
    from processor.files import CURRENT_VERSION

    header: SessionHeader = {
        "type": "session",
        "version": CURRENT_VERSION,
        "id": session_id,
        "createdAt": 1_700_000_000_000,
        "isSeeded": seeded,
        "delegationDepth": 0,
        "cwd": "/work/example",
    }
    if parent is not None:
        header["parentSession"] = parent
    return header


def start_run(
    session_id: str = "scripted",
    *,
    header: SessionHeader | None = None,
    prompt: str = "You are a careful coding agent.",
    context: str = "",
    sink: Callable[[Event], None] | None = None,
    keep_last: int = 2,
) -> ScriptedRun:
    """A fresh agent (dynamic prompt and context), session, mock adapter and loop."""
    texts = {"prompt": prompt, "context": context}
    agent = Agent()
    agent.prompt.add_section(Section("main", 0, lambda _c: texts["prompt"], interpolate=False))
    agent.prompt.add_context(ContextSection("env", 0, lambda _c: texts["context"]))
    session = agent.new_session(header if header is not None else session_header(session_id))
    adapter = MockModelAdapter(routes=ROUTES, default_reply=Say("done"))
    loop = StepLoop(
        agent,
        session,
        adapter,
        sink=sink,
        clock=LogicalClock(),
        plugins=[CompactionPlugin(keep_last=keep_last)],
    )
    return ScriptedRun(agent, session, adapter, loop, texts)


def run_script(
    turns: Sequence[TurnScript],
    session_id: str = "scripted",
    *,
    sink: Callable[[Event], None] | None = None,
    **options: Any,
) -> ScriptedRun:
    """Run ``turns`` through a fresh scripted agent; see :class:`TurnScript`."""
    run = start_run(session_id, sink=sink, **options)
    for turn in turns:
        run.play(turn)
    return run


# ------------------------------------------------------------------ random scripts

_PROMPTS = (
    "You are a careful coding agent.",
    "You are a terse reviewer.",
    "You explain every step.",
    "",
)
_CONTEXTS = ("cwd: /work", "cwd: /work/src", "branch: main, dirty", "")
_ROUTE_WEIGHTS = (("default", 6), (None, 6), ("incapable", 2), ("other", 2))


def _route(rng: random.Random) -> str | None:
    names = [r for r, _ in _ROUTE_WEIGHTS]
    return rng.choices(names, [w for _, w in _ROUTE_WEIGHTS])[0]


def random_script(rng: random.Random, turns: int = 4) -> list[TurnScript]:
    """A random script: every feature of the loop, in sensible proportions."""
    script: list[TurnScript] = []
    active: set[str] = set()
    for n in range(turns):
        items: list[ScriptItem] = []
        steps = rng.choice((1, 1, 2, 3))
        for step in range(steps):
            for _ in range(rng.choice((0, 0, 0, 1, 2))):
                kind = rng.random()
                items.append(Overflow(route=_route(rng)) if kind < 0.3 else Fail(route=_route(rng)))
            if step < steps - 1:
                names = sorted(active | {"nope"}) if active else ["nope"]
                calls = [
                    ToolCall(rng.choice(names), {"n": rng.randint(0, 9)})
                    for _ in range(rng.randint(1, 2))
                ]
                items.append(Say(rng.choice(("", "let me look")), calls, route=_route(rng)))
            elif rng.random() < 0.1:
                items.append(MaxTokens("a very long answer", route=_route(rng)))
            else:
                items.append(Say(f"answer {n}", route=_route(rng)))
        add = tuple(t for t in TOOLS if t not in active and rng.random() < 0.25)
        remove = tuple(t for t in sorted(active) if rng.random() < 0.15)
        active = (active | set(add)) - set(remove)
        script.append(
            TurnScript(
                inputs=(f"question {n}",),
                items=tuple(items),
                prompt=rng.choice(_PROMPTS) if rng.random() < 0.3 else None,
                context=rng.choice(_CONTEXTS) if rng.random() < 0.4 else None,
                add_tools=add,
                remove_tools=remove,
                config={"temperature": rng.choice((0.0, 0.5))} if rng.random() < 0.1 else None,
                splice=("a note for later",) if rng.random() < 0.1 else (),
            )
        )
    return script


@dataclass(frozen=True)
class ScriptedSession:
    session_id: str
    header: SessionHeader
    events: list[Event]


def scripted_sessions(
    n: int,
    *,
    seed: int = 42,
    turns: int = 8,
    sink_for: Callable[[str], Callable[[Event], None]] | None = None,
) -> Iterator[tuple[str, list[Event]]]:
    """``n`` scripted agent sessions ``(session id, events)``, deterministic per seed.

    ``sink_for(session_id)`` may return a sink that receives each event as the
    loop commits it (e.g. a Kafka session writer).
    """
    rng = random.Random(seed)
    for i in range(n):
        sid = f"demo-session-{i:02d}"
        script = random_script(random.Random(rng.random()), turns)
        run = run_script(
            script, sid, sink=sink_for(sid) if sink_for is not None else None, context="cwd: /work"
        )
        yield sid, run.events


# ------------------------------------------------------------------ the example file

_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAE"
    "hQGAhKmMIQAAAABJRU5ErkJggg=="
)


def example_session() -> tuple[SessionHeader, list[Event]]:
    """The example session: a forked, scripted agent run using every event type.

    The loop writes nearly everything; ``session/end-seed`` (the fork cut),
    ``image/offload`` (the built-in message projection) and an ignorable
    vendor event are appended through the same validate-then-append path.
    """
    header = session_header("example", seeded=True, parent="example-parent")
    run = start_run(header=header, context="cwd: /work/example")
    # -- the inherited prefix (the parent's first turn)
    run.play(
        TurnScript(
            inputs=("Where is the config loaded?",),
            add_tools=("read", "grep"),
            items=(
                Say("Let me search.", [ToolCall("grep", {"pattern": "config"})]),
                Say("In processor/service/config.py."),
            ),
        )
    )
    run.loop.commit(EventDraft("session/end-seed", {"inherited": True}))
    # -- this session: a resumed loop with an image, compaction, retries, tools
    run.resume()
    run.play(
        TurnScript(
            inputs=(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Here is a screenshot of the error."},
                        {"type": "image", "mediaType": "image/png", "data": _PNG},
                    ],
                },
            ),
            items=(
                Fail("overloaded", "the model is overloaded"),
                Say(
                    "I see a stack trace; reading the file.",
                    [ToolCall("read", {"path": "processor/service/config.py"})],
                ),
                Say("The error comes from a missing key."),
            ),
            context="cwd: /work/example, branch: fix-config",
            add_tools=("edit",),
            splice=("Also update the changelog.",),
        )
    )
    image = next(
        e
        for e in reversed(run.events)
        if e.type == "user/message" and any(b.get("type") == "image" for b in e.data["content"])
    )
    # the runtime's image-offload payload: the first image block of that message
    run.loop.commit(
        EventDraft("image/offload", {"targets": [{"seq": image.seq, "imageIndexes": [0]}]})
    )
    run.loop.commit(EventDraft("vendor/telemetry", {"latencyMs": 42}, ignorable=True))
    # no new input: the prompt queued for the next turn drives it (the runtime's inbox)
    run.play(
        TurnScript(
            inputs=(),
            prompt="You are a careful coding agent. Prefer small diffs.",
            items=(
                Overflow(),
                Say(
                    "Updating it.",
                    [ToolCall("edit", {"path": "CHANGELOG.md", "old": "", "new": "fix"})],
                    route="incapable",
                ),
                Say("Done: the changelog has an entry now."),
            ),
            remove_tools=("grep",),
            context="",
        )
    )
    run.play(
        TurnScript(
            inputs=("Thanks! Summarise in one line.",), items=(MaxTokens("The config loader now"),)
        )
    )
    return header, run.events


def main(argv: Sequence[str] | None = None) -> None:
    """Regenerate ``processor/examples/session.jsonl`` (or the path given)."""
    from processor.files import write_session_file

    args = list(sys.argv[1:] if argv is None else argv)
    path = Path(args[0]) if args else EXAMPLE_PATH
    header, events = example_session()
    write_session_file(path, header, events)
    print(f"wrote {len(events)} events to {path}")


if __name__ == "__main__":
    main()
