"""The error root of ``processor``, and the session core's error type.

Every error ``processor`` raises on purpose is a :class:`ProcessorError`, of
one of the two kinds a caller acts on differently:

* :class:`InvalidInput` — an event, a record, a file, a command or a prompt
  contribution is wrong.  Retrying cannot help: refuse it with its one line
  (CLI), dead-letter it (service), fix the input.
* :class:`Unavailable` — what the process depends on refused or is gone
  (Kafka, the local broker, the history a checkpoint names).  The process
  ends with one line; an operator or a restart fixes it.

The concrete classes keep their historical second base (``ValueError``,
``RuntimeError``) so ``except ValueError`` callers still work.  Every core
rejection names the seq it happened at and the rule it violated, so a DLQ
record, a CLI message and a test assertion all say the same thing.
"""

from __future__ import annotations

import re
from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class ProcessorError(Exception):
    """Root of every error ``processor`` raises on purpose."""


class InvalidInput(ProcessorError):
    """Bad input: refuse or dead-letter it, never retry."""


class Unavailable(ProcessorError):
    """A dependency refused or is gone: end with one line."""


class SessionError(InvalidInput):
    """An event (or a read) violated a rule of docs/session-semantics.md.

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


def raised_from(err: E, cause: BaseException | None) -> E:
    """``err`` chained as ``raise err from cause`` chains it, in both builds.

    The compiled build (mypyc) ignores a ``raise`` statement's ``from``
    clause: ``raise err from None`` there still prints the handled error
    ("During handling of the above exception, another exception occurred")
    and ``from exc`` sets no ``__cause__``.  Assigning ``__cause__`` (``None``
    included) also sets ``__suppress_context__``, as ``from`` does.  Write
    ``raise raised_from(err, cause) from cause``: the ``from`` serves the
    pure build's readers and the linter (tests/core/test_error_chaining.py
    checks every compiled module does this).
    """
    err.__cause__ = cause
    return err


# ``<_io.BytesIO object at 0x7f3a...>``, ``<function f at 0x...>``: a repr that
# names a memory address, different on every call and meaningless in a dead
# letter, a log line or a test that compares two reasons.
_ADDRESSED_REPR = re.compile(r"<([A-Za-z_][\w.]*)(?: object)?(?: [^<>]*)? at 0x[0-9a-fA-F]+>")


def _plain_repr(match: re.Match[str]) -> str:
    name = match.group(1)
    return "the input" if name.startswith("_io.") else f"<{name}>"


def without_addresses(text: str) -> str:
    """``text`` with every addressed repr replaced by what it names."""
    return _ADDRESSED_REPR.sub(_plain_repr, text)


def library_text(exc: BaseException) -> str:
    """``"TypeName: message"`` of a library's exception, without object addresses.

    Every reason we emit that quotes another library (fastavro, orjson,
    zstandard, the schema registry's HTTP client, librdkafka) goes through
    this, so the same fault reads the same every time it happens.
    """
    text = without_addresses(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
