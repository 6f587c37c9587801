"""One error root: every exception class of ``processor`` is a ProcessorError of one kind.

Callers (the CLI, the service loop, users of the library) catch
``InvalidInput`` to refuse or dead-letter and ``Unavailable`` to end with one
line; a new exception class outside the two would escape both.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import processor
from processor.core.errors import InvalidInput, ProcessorError, Unavailable

SKIP = ("processor.__main__", "processor.examples.")


def exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(processor.__path__, "processor."):
        if info.name.startswith(SKIP):
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.startswith("processor."):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


def test_every_exception_class_is_a_processor_error_of_one_kind() -> None:
    classes = exception_classes()
    assert len(classes) >= 15, classes
    for cls in classes:
        if cls in (ProcessorError, InvalidInput, Unavailable):
            continue
        assert issubclass(cls, ProcessorError), cls
        assert issubclass(cls, InvalidInput) != issubclass(cls, Unavailable), cls


def test_the_kinds_callers_act_on() -> None:
    from processor.codec import CodecError
    from processor.core.errors import SessionError
    from processor.kafka.client_errors import KafkaFatal

    assert issubclass(SessionError, InvalidInput) and issubclass(CodecError, InvalidInput)
    assert issubclass(KafkaFatal, Unavailable)
    assert issubclass(CodecError, ValueError)  # historical bases kept for old callers


def test_an_uncaught_processor_error_is_one_line_not_a_traceback(
    monkeypatch: Any, capsys: Any
) -> None:
    import pytest

    from processor.cli import main as cli_main
    from processor.codec import CodecError

    def failing(**_: Any) -> None:
        raise CodecError("seq 3: not a SessionEvent record\nsecond line")

    monkeypatch.setattr(cli_main, "cli", failing)
    with pytest.raises(SystemExit) as exited:
        cli_main.main()
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err == "processor: seq 3: not a SessionEvent record\n"


def test_library_text_carries_no_object_address() -> None:
    """A library's repr with a memory address differs on every call: reasons drop it."""
    import io

    from processor.core.errors import library_text

    def fails() -> Exception:
        return ValueError(f"cannot read boolean from {io.BytesIO(b'x')!r}")

    first, second = library_text(fails()), library_text(fails())
    assert first == second == "ValueError: cannot read boolean from the input"
    assert library_text(KeyError(object())) == "KeyError: <object>"
    assert library_text(RuntimeError()) == "RuntimeError"


def test_a_corrupt_record_reads_the_same_reason_every_time() -> None:
    """The same corrupt body gives the same dead-letter reason on every decode."""
    import pytest

    from processor.codec import CodecError, default_codec

    codec = default_codec()
    good = codec.encode_event(
        "s", {"seq": 0, "type": "session/start", "time": 1, "data": {}, "ignorable": True}
    )
    bad = good[:-5] + b"\x00\x01\x02\x01\x02"  # fastavro: "cannot read boolean from <BytesIO ...>"
    reasons = set()
    for _ in range(3):
        with pytest.raises(CodecError) as caught:
            codec.decode_event(bad)
        reasons.add(str(caught.value))
    assert len(reasons) == 1, reasons
    assert " at 0x" not in reasons.pop()
