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
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from processor.codec import Codec, SchemaIdResolver, default_codec
from processor.codec.names import CHECKPOINT, DEAD_LETTER, SESSION_EVENT, VIEW, CodecError
from processor.config import ServiceConfig
from processor.core.errors import Unavailable

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
RECORD_TYPES = (SESSION_EVENT, VIEW, CHECKPOINT, DEAD_LETTER)


class RegistryError(Unavailable, RuntimeError):
    """The schema registry refused or did not answer."""


class RegistryClient:
    """A :class:`SchemaIdResolver` over a Confluent Schema Registry's REST API."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
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
                f"schema registry {self.base}: {method} {path} -> {exc.code} {detail}"
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
        got = self._call("GET", f"/schemas/ids/{schema_id}")
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
