"""Errors chain in the compiled build as in the pure one: no stale handled error.

Two mypyc behaviours made compiled tracebacks show an unrelated
``orjson.JSONDecodeError`` ("During handling of the above exception, another
exception occurred"):

- a generator that yields inside an ``except`` block leaves the handled
  error as the current exception of its caller while it is suspended (the
  interpreter swaps it out at the yield; mypyc does not), so any later error
  in the caller chains it as ``__context__`` (``files.json_lines`` did so
  for a dropped torn tail);
- a ``raise`` statement's ``from`` clause is ignored: ``from None`` does not
  suppress the context, ``from exc`` sets no ``__cause__``
  (``errors.raised_from`` sets them explicitly).

``scripts/test_compiled.sh`` runs these on the compiled wheel too; the
source checks below keep both patterns out of the compiled modules.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest
import zstandard

from processor.core.errors import SessionError, raised_from
from processor.core.events import parse_event_bytes
from processor.files import SessionFileError, json_lines, read_bytes
from tests.deploy.test_wheel import compiled_modules

ROOT = Path(os.environ.get("PROCESSOR_PURE_SOURCE") or Path(__file__).parents[2])


def shown(exc: BaseException) -> BaseException | None:
    """The error a traceback prints above ``exc`` (what ``traceback`` chains)."""
    if exc.__cause__ is not None:
        return exc.__cause__
    return None if exc.__suppress_context__ else exc.__context__


def later_error() -> RuntimeError:
    try:
        raise RuntimeError("unrelated, later")
    except RuntimeError as exc:
        return exc


def test_a_dropped_torn_tail_leaves_no_handled_error_behind() -> None:
    lines = json_lines(b'{"a": 1}\n{"torn', drop_torn_tail=True)
    assert next(lines)[1] == {"a": 1}
    offset, value, torn = next(lines)  # the generator is suspended at the torn tail
    assert torn is not None and value is None and offset == 9
    assert sys.exc_info() == (None, None, None)
    assert later_error().__context__ is None
    assert list(lines) == []


@pytest.mark.parametrize(
    "content", [b'{"a": 1}\nnot json\n{"b": 2}\n', b'{"a": 1}\n{"torn'], ids=["line", "torn"]
)
def test_a_line_that_is_not_json_is_refused_without_the_decode_error(content: bytes) -> None:
    with pytest.raises(SessionFileError) as info:
        list(json_lines(content))
    assert shown(info.value) is None
    assert later_error().__context__ is None


def test_an_event_that_is_not_json_is_refused_without_the_decode_error() -> None:
    with pytest.raises(SessionError, match="E-3") as info:
        parse_event_bytes(b'{"seq": 0,')
    assert shown(info.value) is None
    assert info.value.__suppress_context__


def test_a_corrupt_zstd_file_is_refused_without_the_codec_error(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl.zst"
    frame = zstandard.ZstdCompressor().compress(b'{"a": 1}\n' * 100)
    path.write_bytes(frame[:8] + b"\xff" * 16 + frame[24:])
    with pytest.raises(SessionFileError, match="corrupt zstd") as info:
        read_bytes(path)
    assert shown(info.value) is None


def test_raised_from_sets_what_from_sets() -> None:
    cause = KeyError("inner")
    try:
        try:
            raise cause
        except KeyError as inner:
            raise raised_from(ValueError("outer"), inner) from inner
    except ValueError as exc:
        assert exc.__cause__ is cause and exc.__suppress_context__
    try:
        try:
            raise KeyError("inner")
        except KeyError:
            raise raised_from(ValueError("outer"), None) from None
    except ValueError as exc:
        assert shown(exc) is None


# ------------------------------------------------------------ the source


def _compiled_sources() -> list[Path]:
    return [ROOT / (name.replace(".", "/") + ".py") for name in compiled_modules()]


class _Finder(ast.NodeVisitor):
    """Yields inside an except/finally block, and ``raise ... from`` that does
    not go through ``raised_from`` (both misbehave once compiled)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handling: list[str] = []  # the enclosing handlers of this function
        self.found: list[str] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self.handling = self.handling, []
        self.generic_visit(node)
        self.handling = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Try(self, node: ast.Try) -> None:
        for child in [*node.body, *node.orelse]:
            self.visit(child)
        for handler in node.handlers:
            self.handling.append("except")
            self.visit(handler)
            self.handling.pop()
        self.handling.append("finally")
        for child in node.finalbody:
            self.visit(child)
        self.handling.pop()

    def _yield(self, node: ast.Yield | ast.YieldFrom) -> None:
        if self.handling:
            self.found.append(f"{self.path}:{node.lineno}: yield inside {self.handling[-1]}")

    visit_Yield = _yield
    visit_YieldFrom = _yield

    def visit_Raise(self, node: ast.Raise) -> None:
        if node.cause is None:
            return
        call = node.exc
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "raised_from"
            and len(call.args) == 2
            and ast.dump(call.args[1]) == ast.dump(node.cause)
        ):
            self.found.append(f"{self.path}:{node.lineno}: raise ... from without raised_from")


def test_no_compiled_module_yields_while_handling_or_relies_on_raise_from() -> None:
    if not (ROOT / "processor").is_dir():
        pytest.skip("the source is not here (PROCESSOR_PURE_SOURCE unset)")
    found: list[str] = []
    for path in _compiled_sources():
        finder = _Finder(path.relative_to(ROOT))
        finder.visit(ast.parse(path.read_text()))
        found += finder.found
    assert found == []
