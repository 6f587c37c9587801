"""The one error type of the session core.

Every rejection names the seq it happened at and the rule it violated, so a
DLQ record, a CLI message and a test assertion all say the same thing.
"""

from __future__ import annotations


class SessionError(Exception):
    """An event (or a read) violated a rule of SESSION-SEMANTICS.md.

    ``str(err)`` is ``"seq N: <reason> (RULE)"``; ``reason`` alone is the
    spec-phrased text.
    """

    def __init__(self, seq: int | None, rule: str, reason: str) -> None:
        self.seq = seq
        self.rule = rule
        self.reason = reason
        where = f"seq {seq}" if seq is not None else "session"
        super().__init__(f"{where}: {reason} ({rule})")


class ProjectionError(SessionError):
    """A domain projection rule (P-*) was violated."""
