"""The Avro schema folder and the Confluent schema-id resolver (see the package doc)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import fastavro
from fastavro.schema import fingerprint as _fingerprint_hex
from fastavro.schema import to_parsing_canonical_form

from processor.codec.names import (
    CodecError,
)


def schema_fingerprint(schema: Mapping[str, Any] | str) -> bytes:
    """The 8-byte CRC-64-AVRO fingerprint (little-endian) of a schema."""
    canonical = to_parsing_canonical_form(_parse(schema))
    # fastavro's hex already spells the little-endian bytes (as Java does).
    return bytes.fromhex(_fingerprint_hex(canonical, "CRC-64-AVRO"))


def _load_json(schema: Mapping[str, Any] | str) -> dict[str, Any]:
    if isinstance(schema, str):
        loaded = json.loads(schema)
        if not isinstance(loaded, dict):
            raise CodecError("a record schema must be a JSON object")
        return loaded
    return dict(schema)


def _parse(schema: Mapping[str, Any] | str) -> Any:
    return fastavro.parse_schema(_load_json(schema), {})


@dataclass(frozen=True, slots=True, eq=False)
class SchemaInfo:
    """One schema file: its full name, fingerprint and parsed form."""

    name: str
    fingerprint: bytes
    canonical: str
    schema: dict[str, Any]
    parsed: Any
    current: bool
    path: Path | None = None


@dataclass(frozen=True, slots=True, eq=False)
class _Plan:
    """How to read a body: writer schema, and reader schema when they differ."""

    name: str
    writer: Any
    reader: Any


def find_schema_dir() -> Path:
    """The schema folder: the checkout's ``schemas/``, else the wheel's copy.

    A source checkout reads the repository's ``schemas/`` (the contract other
    languages read too, so there is one copy to edit).  An installed wheel has
    no repository: the build copies the same files into ``processor/schemas/``
    (see setup.py), which is found through the package itself.
    """
    package = Path(__file__).resolve().parents[1]  # processor/codec/schemas.py
    candidates = (package.parent / "schemas", package / "schemas")
    for candidate in candidates:
        if (candidate / "session_event.avsc").is_file():
            return candidate
    raise CodecError(
        "Avro schemas not found; looked in "
        + ", ".join(str(c) for c in candidates)
        + " (a wheel built without setup.py's data step?)"
    )


class SchemaStore:
    """Every known schema, indexed by fingerprint; current ones also by name."""

    _default: SchemaStore | None = None
    _default_lock = threading.Lock()

    def __init__(self) -> None:
        self._by_fp: dict[bytes, SchemaInfo] = {}
        self._current: dict[str, SchemaInfo] = {}
        self._plans: dict[bytes, _Plan] = {}

    @classmethod
    def from_directory(cls, path: Path | str) -> SchemaStore:
        """Load ``path/*.avsc`` as current and ``path/history/*.avsc`` as old."""
        root = Path(path)
        store = cls()
        files = sorted(root.glob("*.avsc"))
        if not files:
            raise CodecError(f"no .avsc files in {root}")
        for file in files:
            store.add(file.read_text("utf-8"), current=True, path=file)
        for file in sorted((root / "history").glob("*.avsc")):
            store.add(file.read_text("utf-8"), current=False, path=file)
        return store

    @classmethod
    def default(cls) -> SchemaStore:
        """The process-wide store of :func:`find_schema_dir` (loaded once)."""
        store = cls._default
        if store is None:
            with cls._default_lock:
                store = cls._default
                if store is None:
                    store = cls._default = cls.from_directory(find_schema_dir())
        return store

    def add(
        self, schema: Mapping[str, Any] | str, *, current: bool, path: Path | None = None
    ) -> SchemaInfo:
        raw = _load_json(schema)
        try:
            parsed = fastavro.parse_schema(raw, {})
        except Exception as exc:
            raise CodecError(f"invalid Avro schema {path or ''}: {exc}") from exc
        if not isinstance(parsed, dict) or parsed.get("type") != "record":
            raise CodecError(f"schema {path or ''} is not a record schema")
        canonical = to_parsing_canonical_form(parsed)
        fp = bytes.fromhex(_fingerprint_hex(canonical, "CRC-64-AVRO"))
        info = SchemaInfo(str(parsed["name"]), fp, canonical, raw, parsed, current, path)
        if current:
            old = self._current.get(info.name)
            if old is not None and old.fingerprint != fp:
                raise CodecError(f"two current schemas for {info.name}: {old.path} and {path}")
            self._current[info.name] = info
            self._plans.clear()
        if fp not in self._by_fp or current:
            self._by_fp[fp] = info
        return info

    def current(self, name: str) -> SchemaInfo:
        info = self._current.get(name)
        if info is None:
            raise CodecError(f"no current schema for record type {name}")
        return info

    def get(self, fp: bytes) -> SchemaInfo | None:
        return self._by_fp.get(fp)

    def __iter__(self) -> Iterator[SchemaInfo]:
        return iter(list(self._by_fp.values()))

    def __len__(self) -> int:
        return len(self._by_fp)

    def plan(self, fp: bytes) -> _Plan:
        """Writer/reader pair for a writer fingerprint (cached)."""
        plan = self._plans.get(fp)
        if plan is not None:
            return plan
        info = self._by_fp.get(fp)
        if info is None:
            known = ", ".join(sorted(f"{i.name}@{f.hex()}" for f, i in self._by_fp.items()))
            raise CodecError(f"unknown writer schema fingerprint {fp.hex()} (known: {known})")
        plan = self.plan_for(info.name, info.parsed, fp)
        self._plans[fp] = plan
        return plan

    def plan_for(self, name: str, writer: Any, fp: bytes) -> _Plan:
        reader = self.current(name)
        return _Plan(name, writer, None if reader.fingerprint == fp else reader.parsed)


class SchemaIdResolver(Protocol):
    """A schema registry client, as far as the codec needs one.

    ``subject`` is the record's full name (``processor.v1.SessionEvent``).
    ``schema_for_id`` returns the writer schema as JSON text or a dict, and
    raises ``KeyError`` (or any error) for an unknown id: the record is bad
    input.  An :class:`~processor.core.errors.Unavailable` error (the registry
    did not answer) passes through the codec as it is: not the record's fault.
    Both are called once per id / record type per :class:`Codec` (results are
    cached).
    """

    def id_for_schema(self, subject: str, schema: Mapping[str, Any]) -> int: ...

    def schema_for_id(self, schema_id: int) -> str | Mapping[str, Any]: ...


class InMemorySchemaRegistry:
    """A process-local :class:`SchemaIdResolver` (tests, demos).

    Like a registry, one id per distinct schema (by parsing canonical form),
    shared across subjects; ids count up from ``first_id``.
    """

    def __init__(self, first_id: int = 1) -> None:
        self._next = first_id
        self._by_canonical: dict[str, int] = {}
        self._by_id: dict[int, str] = {}
        self.subjects: dict[str, list[int]] = {}

    def id_for_schema(self, subject: str, schema: Mapping[str, Any]) -> int:
        text = json.dumps(schema)
        canonical = to_parsing_canonical_form(_parse(text))
        schema_id = self._by_canonical.get(canonical)
        if schema_id is None:
            schema_id = self._next
            self._next += 1
            self._by_canonical[canonical] = schema_id
            self._by_id[schema_id] = text
        versions = self.subjects.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return schema_id

    def schema_for_id(self, schema_id: int) -> str:
        return self._by_id[schema_id]
