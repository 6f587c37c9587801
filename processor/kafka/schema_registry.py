"""Confluent Schema Registry framing, switched on by ``schema_registry``.

Without a registry every record is Avro single-object encoded (the writer
schema's fingerprint, resolved against the packaged ``schemas/``).  With
``schema_registry = "http://host:8081"`` the service writes the Confluent
wire format instead (``00`` + 4-byte schema id + body) so Confluent's
deserializers in other languages read our topics; readers accept both
framings, so a topic can move from one to the other.

Schema ids are the registry's: the writer registers the current schema of
each record type under the subject = the record's full name
(RecordNameStrategy, e.g. ``processor.v1.View``; registering an existing
schema returns its id) at start, so an unreachable or refusing registry ends
the start with one line instead of failing the first commit.  Readers only
look ids up (``GET /schemas/ids/<id>``), each once per process.  Two REST
calls, so a client of our own on the standard library (bounded by
``timeout_s``; ``user:password@`` in the URL is sent as basic auth) rather
than a dependency.

A lookup tells bad input from a registry outage.  An id the registry does
not know (404) is the record's fault: a CODEC dead letter.  A registry that
does not answer, or answers 5xx / 408 / 429, is not: dead-lettering would
quarantine every session whose records carry a writer schema this process
has not seen yet (a member just handed an older writer's partition).  Such
a lookup is retried up to ``lookup_bound_s`` while ``/readyz`` names it;
past that the run ends with one :class:`RegistryError` line, and the
uncommitted batch is folded again once a member can read the registry.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from processor.codec import Codec, SchemaIdResolver, default_codec
from processor.codec.names import CHECKPOINT, DEAD_LETTER, SESSION_EVENT, VIEW, CodecError
from processor.config import ServiceConfig
from processor.core.errors import InvalidInput, Unavailable
from processor.kafka.retry import waiting

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
RECORD_TYPES = (SESSION_EVENT, VIEW, CHECKPOINT, DEAD_LETTER)
#: HTTP answers a later attempt can succeed past (a restarting backend, a
#: proxy in front of it, a rate limit)
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: how long a lookup of an unseen schema id rides out a registry outage
LOOKUP_BOUND_S = 30.0


class RegistryError(Unavailable, RuntimeError):
    """The schema registry refused or did not answer.

    ``status``: the HTTP status, None when nothing answered; ``transient``:
    a later attempt may succeed (no answer, or one of :data:`TRANSIENT_STATUS`).
    """

    def __init__(self, line: str, status: int | None = None) -> None:
        super().__init__(line)
        self.status = status
        self.transient = status is None or status in TRANSIENT_STATUS


class SchemaNotFound(InvalidInput, LookupError):
    """The registry answered that it has no schema of this id: the record is bad."""


class RegistryClient:
    """A :class:`SchemaIdResolver` over a Confluent Schema Registry's REST API."""

    def __init__(
        self, url: str, timeout_s: float = 10.0, lookup_bound_s: float | None = None
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RegistryError(f"schema registry URL {url!r} is not http(s)://host[:port]")
        self._auth: str | None = None
        if parts.username is not None:
            user, password = parts.username, parts.password or ""
            raw = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
            self._auth = "Basic " + base64.b64encode(raw.encode()).decode()
        host = parts.hostname + (f":{parts.port}" if parts.port else "")
        self.base = urllib.parse.urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
        self.timeout_s = timeout_s
        self.lookup_bound_s = LOOKUP_BOUND_S if lookup_bound_s is None else lookup_bound_s

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Accept", CONTENT_TYPE)
        if data is not None:
            req.add_header("Content-Type", CONTENT_TYPE)
        if self._auth is not None:
            req.add_header("Authorization", self._auth)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            raise RegistryError(
                f"schema registry {self.base}: {method} {path} -> {exc.code} {detail}", exc.code
            ) from None
        except (OSError, ValueError) as exc:
            raise RegistryError(f"schema registry {self.base}: {method} {path}: {exc}") from None

    def id_for_schema(self, subject: str, schema: Mapping[str, Any]) -> int:
        quoted = urllib.parse.quote(subject, safe="")
        got = self._call("POST", f"/subjects/{quoted}/versions", {"schema": json.dumps(schema)})
        if not isinstance(got, dict) or not isinstance(got.get("id"), int):
            raise RegistryError(f"schema registry {self.base}: no id for {subject}: {got!r}")
        return int(got["id"])

    def schema_for_id(self, schema_id: int) -> str:
        """The writer schema of ``schema_id``: :class:`SchemaNotFound` when the registry
        has none, :class:`RegistryError` when it did not answer within the bound."""
        path = f"/schemas/ids/{schema_id}"
        deadline = time.monotonic() + self.lookup_bound_s
        delay, attempt = 0.25, 0
        with contextlib.ExitStack() as named:
            while True:
                try:
                    got = self._call("GET", path)
                    break
                except RegistryError as exc:
                    if exc.status == 404:
                        raise SchemaNotFound(str(exc)) from None
                    attempt += 1
                    if not exc.transient or time.monotonic() + delay > deadline:
                        if attempt > 1:
                            exc.args = (f"{exc} (tried {attempt} times)",)
                        raise
                    if attempt == 1:  # /readyz names the wait from the first failure
                        named.enter_context(
                            waiting(
                                f"the schema registry to answer for schema id {schema_id} "
                                f"(at most {self.lookup_bound_s:.0f}s)"
                            )
                        )
                    log.warning("%s; retrying in %.2fs (attempt %d)", exc, delay, attempt)
                    time.sleep(delay)
                    delay = min(delay * 2, 4.0)
        if not isinstance(got, dict) or not isinstance(got.get("schema"), str):
            raise RegistryError(f"schema registry {self.base}: no schema {schema_id}: {got!r}")
        return str(got["schema"])


def codec_for(
    config: ServiceConfig, *, writer: bool = False, resolver: SchemaIdResolver | None = None
) -> Codec:
    """The codec ``config`` asks for: single-object, or Confluent with a registry.

    ``writer``: register every record type's current schema now, so a
    registry problem ends the start with one line.  ``resolver`` replaces
    the REST client (tests; an in-process registry).
    """
    if not config.schema_registry and resolver is None:
        return default_codec()
    codec = Codec("confluent", resolver=resolver or RegistryClient(config.schema_registry))
    if writer:
        for name in RECORD_TYPES:
            try:
                codec.header(name)
            except CodecError as exc:
                raise RegistryError(str(exc)) from None
    return codec
