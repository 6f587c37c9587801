"""Random but valid session logs, for property tests, examples and benches.

``generate_session(rng, n)`` walks a little state machine: every step picks an
action that is valid against the current surface (it keeps a
:class:`SurfaceState` of its own, planned with the real planner), so the log
exercises appends, compaction replaces of ranges, tool-result rewrites,
system-head rewrites, tool additions/removals, image offloads, domain events
and ignorable unknown events.  With a ``random.Random`` it is a fast workload
generator; with hypothesis' ``st.randoms()`` it shrinks.  Like a real agent it
compacts when the surface outgrows its context budget and admits spliced
inbox messages a little later, so the surface and the inbox stay bounded.
"""

from __future__ import annotations

import random
from typing import Any

from processor.core.builder import LogBuilder, text, tool_def
from processor.core.defaults import default_message_projections
from processor.core.events import Event, parse_event
from processor.core.frozen import thaw
from processor.core.surface import SurfaceState, commit_plan, plan_event

TOOL_NAMES = ("read", "grep", "edit", "shell", "search", "fetch")


_VOCABULARY: list[str] = []


def vocabulary() -> list[str]:
    """A fixed list of 4,096 pseudo-words (2 to 10 letters), the same in every run."""
    if not _VOCABULARY:
        r = random.Random(20241203)
        letters = "abcdefghijklmnopqrstuvwxyz"
        _VOCABULARY.extend("".join(r.choices(letters, k=r.randint(2, 10))) for _ in range(4096))
    return _VOCABULARY


def prose(rng: random.Random, size: int) -> str:
    """``size`` characters of pseudo-random words and lines.

    Unlike ``"x" * size`` it does not compress to nothing, so byte counts
    measured on it (compressed or not) look like those of real tool output.
    """
    words = vocabulary()
    out: list[str] = []
    length = 0
    while length < size:
        line = " ".join(rng.choices(words, k=rng.randint(3, 14)))
        out.append(line)
        length += len(line) + 1
    return "\n".join(out)[:size]


class _Walker:
    def __init__(
        self,
        rng: random.Random,
        big_result_bytes: int,
        big_ratio: float,
        form: int,
        words: bool = False,
        context_budget: int | None = None,
    ) -> None:
        self.rng = rng
        self.b = LogBuilder(form=form)
        self.state = SurfaceState()
        self.registry = default_message_projections()
        self.big = big_result_bytes
        self.big_ratio = big_ratio
        self.active_tools: list[str] = []
        self.header_seq: int | None = None
        self.header_tools: dict[str, dict[str, Any]] = {}
        self.in_step = False
        self.inbox_pending: list[tuple[str, dict[str, Any]]] = []
        self.inbox_queues: dict[str, list[dict[str, Any]]] = {"next-turn": [], "next-step": []}
        self.words = words
        self.context_budget = rng.randint(60, 200)  # surface nodes before a compaction
        if context_budget is not None:
            self.context_budget = context_budget

    # every event goes through the real planner: the generator cannot drift
    def commit(self, event: Event) -> None:
        commit_plan(self.state, event, plan_event(self.state, event, self.registry))

    def node_types(self) -> list[tuple[int, str]]:
        return [(s, self.state.node_events[s].type) for s in self.state.nodes]

    # -------------------------------------------------------------- actions

    def user(self) -> None:
        r = self.rng.random()
        if r < 0.1:
            self.b.add_raw(
                "user/message",
                self.b.message(
                    "user",
                    [
                        text("see picture"),
                        {
                            "type": "image",
                            "mediaType": "image/png",
                            "data": "iVBORw0" * self.rng.randint(1, 20),
                        },
                    ],
                ),
                surfaceOp="append",
            )
        else:
            self.b.user(f"question {self.b.next_seq} " + "word " * self.rng.randint(0, 30))

    def assistant(self) -> None:
        calls: list[dict[str, Any]] = []
        if self.rng.random() < 0.5:
            name = self.rng.choice(TOOL_NAMES)
            calls.append(
                {
                    "id": f"call-{self.b.next_seq}",
                    "name": name,
                    "arguments": {"q": self.rng.randint(0, 99)},
                }
            )
        usage = {
            "inputTokens": self.rng.randint(10, 5000),
            "outputTokens": self.rng.randint(1, 900),
        }
        self.b.assistant("answer " * self.rng.randint(0, 20), tool_calls=calls, usage=usage)
        for call in calls:
            ev = self.b.tool_call(call["id"], call["name"], call["arguments"])
            body = self._big_body() if self.rng.random() < self.big_ratio else "ok " * 10
            error = {"name": "ToolError", "code": "E1"} if self.rng.random() < 0.1 else None
            res = self.b.tool_result(call["id"], body, call_seq=ev.seq, error=error)
            if self.rng.random() < 0.05:
                self._with_image(res)

    def _big_body(self) -> str:
        return prose(self.rng, self.big) if self.words else "x" * self.big

    def _with_image(self, res: Event) -> None:
        """Swap a just-written tool result for one that also returns an image."""
        image = {"type": "image", "mediaType": "image/png", "data": "iVBORw0KGgo="}
        raw = thaw(res.to_json())
        message = raw["data"]["message"]
        if message["role"] == "user":
            message["content"][0]["content"].append(image)
        else:
            message["content"].append(image)
        self.b.events[-1] = parse_event(raw)

    def turn(self) -> None:
        if self.in_step:
            self.b.step_end()
            self.b.turn_end()
            self.in_step = False
        else:
            self.b.turn_start()
            self.b.step_start()
            self.in_step = True

    def attempt(self) -> None:
        self.b.attempt()
        self.b.add_raw(
            "llm/retry", {"turn": self.b.turn, "step": self.b.step, "attempt": 1, "delayMs": 10}
        )
        self.b.add_raw("llm/retry-started", {"turn": self.b.turn, "step": self.b.step})

    def header(self) -> None:
        names = sorted(self.rng.sample(TOOL_NAMES, self.rng.randint(1, 4)))
        tools = [tool_def(n, f"{n} v{self.rng.randint(1, 2)}") for n in names]
        reason = "initial" if self.header_seq is None else self.rng.choice(["change", "series"])
        ev = self.b.header(tools, reason=reason)
        added = [n for n in names if n not in self.active_tools]
        removed = [n for n in self.active_tools if n not in names]
        self.header_seq, self.active_tools = ev.seq, names
        self.header_tools = {t["name"]: t for t in tools}
        if added or removed:
            self.b.tool_update(ev.seq, added=added, removed=removed)
        self.b.add_raw(
            "request/context", {"provider": "mock", "model": "mock-1", "contextWindow": 200_000}
        )

    def domain(self) -> None:
        """A log-only event of the runtime's own plugins, in their payload shape."""
        r, n = self.rng, self.b.next_seq
        kind = r.randrange(5)
        if kind == 0:
            statuses = ("pending", "in_progress", "completed")
            todos = [
                {"content": f"task {n}-{i}", "status": statuses[min(i, 2)]}
                for i in range(r.randint(1, 4))
            ]
            self.b.add_raw("todo/write", {"todos": todos})
        elif kind == 1:
            self.b.add_raw(
                "session/title",
                {"title": f"session about {n}", "messageSeqs": [], "source": {"kind": "fallback"}},
            )
        elif kind == 2:
            self.b.add_raw("plan/mode", {"active": r.random() < 0.5})
        elif kind == 3:
            aid = f"approval-{n}"
            self.b.add_raw(
                "approval/asked",
                {"id": aid, "toolName": r.choice(TOOL_NAMES), "reason": "writes a file"},
            )
            self.b.add_raw(
                "approval/decided", {"id": aid, "outcome": r.choice(["allowed-once", "rejected"])}
            )
        else:
            cid = f"cmd-{n}"
            self.b.add_raw(
                "command/run", {"name": "plan", "commandId": cid, "args": r.choice(["", "off"])}
            )
            self.b.add_raw("command/done", {"commandId": cid, "kind": "success"})

    def compact(self) -> None:
        nodes = self.state.nodes
        lo = 1 if nodes and self.state.node_events[nodes[0]].type == "system/message" else 0
        if len(nodes) - lo < 2:
            return self.user()
        i = self.rng.randint(lo, len(nodes) - 2)
        j = self.rng.randint(i + 1, min(len(nodes) - 1, i + 8))
        shadowed = nodes[i : j + 1]
        extra = [self.b.next_seq - 1] if self.rng.random() < 0.3 else []
        sources = sorted(set(shadowed) | set(extra))
        self.b.add_raw("compaction/start", {"trigger": "manual"})
        self.b.summary(f"summary of {len(shadowed)} messages", nodes[i], nodes[j], sources)
        self.b.add_raw("compaction/end", {"ok": True})
        return None

    def rewrite_tool_result(self) -> None:
        results = [s for s, t in self.node_types() if t == "tool/result"]
        if not results:
            return self.user()
        seq = self.rng.choice(results)
        self.b.tool_result(
            "", "[result elided]", like=self.state.node_events[seq], replace=(seq, seq)
        )
        return None

    def rewrite_system(self) -> None:
        nodes = self.state.nodes
        if nodes and self.state.node_events[nodes[0]].type == "system/message":
            self.b.system(
                f"prompt v{self.b.next_seq}", replace=(nodes[0], nodes[0]), sources=[nodes[0]]
            )
        else:
            self.b.system(f"prompt v{self.b.next_seq}")

    def offload(self) -> None:
        """Omit the oldest images still sent, as the image-offload plugin does."""
        for seq in self.state.nodes:
            if self.state.node_events[seq].type not in ("user/message", "tool/result"):
                continue
            images = list(_images(self.state.message_of(seq).get("content", [])))
            chosen = [i for i, done in enumerate(images) if not done]
            if chosen:
                self.b.add_raw(
                    "image/offload",
                    {
                        "targets": [
                            {"seq": seq, "imageIndexes": chosen[: self.rng.randint(1, len(chosen))]}
                        ]
                    },
                )
                return
        self.user()

    def inbox(self) -> None:
        """Queue a user message for a later turn or step (the runtime's inbox splice)."""
        target = self.rng.choice(["next-turn", "next-step"])
        message = {
            "id": f"inbox-{self.b.next_seq}",
            "role": "user",
            "content": [text("ping")],
            "source": {"kind": "user"},
        }
        queue = self.inbox_queues[target]
        self.b.add_raw(
            "agent/inbox/spliced", {"target": target, "start": len(queue), "inserted": [message]}
        )
        queue.append(message)
        self.inbox_pending.append((target, message))

    def deliver_inbox(self) -> None:
        """Claim the oldest queued message at a later step, as the agent loop does."""
        target, message = self.inbox_pending.pop(0)
        queue = self.inbox_queues[target]
        index = queue.index(message)
        self.b.add_raw(
            "agent/inbox/spliced",
            {"target": target, "start": index, "removedCount": 1, "inserted": []},
        )
        queue.pop(index)
        self.b.add_raw("user/message", message, surfaceOp="append")

    def compact_window(self) -> None:
        """Compact like an agent at its context budget: all but the recent tail."""
        nodes = self.state.nodes
        lo = 1 if nodes and self.state.node_events[nodes[0]].type == "system/message" else 0
        keep = self.rng.randint(4, 12)
        if len(nodes) - lo < 3:
            return self.user()
        keep = min(keep, len(nodes) - lo - 2)  # a small budget still shrinks the surface
        shadowed = nodes[lo : len(nodes) - keep]
        self.b.add_raw("compaction/start", {"trigger": "auto"})
        self.b.summary(
            f"summary of {len(shadowed)} messages", shadowed[0], shadowed[-1], list(shadowed)
        )
        self.b.add_raw(
            "compaction/summary", {"tokensBefore": 100 * len(shadowed), "tokensAfter": 100}
        )
        self.b.add_raw("compaction/end", {"ok": True})
        return None

    def ignorable(self) -> None:
        self.b.add_raw("vendor/telemetry", {"n": self.rng.randint(0, 9)}, ignorable=True)

    ACTIONS: tuple[tuple[str, float], ...] = (
        ("user", 18),
        ("assistant", 30),
        ("turn", 14),
        ("attempt", 2),
        ("header", 1),
        ("compact", 4),
        ("rewrite_tool_result", 3),
        ("rewrite_system", 2),
        ("offload", 2),
        ("inbox", 2),
        ("ignorable", 1),
        ("domain", 3),
    )


def _images(blocks: Any) -> Any:
    """``offloaded`` flags of a message's image blocks, depth-first (M-5 indexes)."""
    for block in blocks if isinstance(blocks, list) else ():
        if isinstance(block, dict) and block.get("type") == "image":
            yield block.get("offloaded") is True
        elif isinstance(block, dict) and block.get("type") == "tool-result":
            yield from _images(block.get("content"))


def generate_session(
    rng: random.Random,
    n_events: int,
    *,
    big_result_bytes: int = 10_000,
    big_ratio: float = 0.02,
    form: int = 4,
    words: bool = False,
    context_budget: int | None = None,
) -> list[Event]:
    """A valid session log of at least ``n_events`` events (cut to exactly n).

    ``form`` picks the message shapes of session format 4 (the runtime's
    newest) or 3 (its released v3 form); see :class:`LogBuilder`.
    ``big_ratio`` is the share of tool results that are ``big_result_bytes``
    long (1.0: every one).  ``words``: big results are pseudo-random words
    (:func:`prose`) instead of ``"x" * n``, for byte counts that survive
    compression.  ``context_budget``: surface nodes at which the agent
    compacts (default: drawn from 60..200 per session).  The defaults keep
    the output of every seed as it was.
    """
    w = _Walker(rng, big_result_bytes, big_ratio, form, words, context_budget)
    w.b.system("You are a careful coding agent.")
    w.commit(w.b.events[0])
    names = [a for a, _ in w.ACTIONS]
    weights = [wt for _, wt in w.ACTIONS]
    while len(w.b.events) < n_events:
        if len(w.state.nodes) > w.context_budget:
            w.compact_window()
        elif w.inbox_pending and rng.random() < 0.3:
            w.deliver_inbox()
        else:
            getattr(w, rng.choices(names, weights)[0])()
        for event in w.b.events[w.state.next_seq :]:
            w.commit(event)
    return w.b.events[:n_events]
