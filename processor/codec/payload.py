"""JSON payloads of views and checkpoints: orjson, zstd when it pays."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import zstandard

from processor.codec.names import (
    COMPRESS_THRESHOLD,
    ZSTD_LEVEL,
    CodecError,
    ViewEncoding,
)
from processor.core.errors import raised_from, without_addresses

_zstd_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    c: zstandard.ZstdCompressor | None = getattr(_zstd_local, "c", None)
    if c is None:
        c = _zstd_local.c = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d: zstandard.ZstdDecompressor | None = getattr(_zstd_local, "d", None)
    if d is None:
        d = _zstd_local.d = zstandard.ZstdDecompressor()
    return d


def _dumps(value: Any, what: str) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        raise raised_from(
            CodecError(f"{what} is not JSON-serialisable: {without_addresses(str(exc))}"), exc
        ) from exc


def _compress_maybe(raw: bytes, threshold: int) -> tuple[ViewEncoding, bytes]:
    if len(raw) > threshold:
        packed = _compressor().compress(raw)
        if len(packed) < len(raw):
            return "ZSTD_JSON", packed
    return "JSON", raw


def _unpack(encoding: str, payload: bytes) -> bytes:
    if encoding == "JSON":
        return payload
    if encoding != "ZSTD_JSON":
        raise CodecError(f"unknown payload encoding {encoding!r}")
    dctx = _decompressor()
    try:
        return dctx.decompress(payload)
    except zstandard.ZstdError:
        pass  # e.g. a frame without content size from another writer
    try:
        return dctx.decompressobj().decompress(payload)
    except zstandard.ZstdError as exc:
        raise raised_from(
            CodecError(f"corrupt zstd payload: {without_addresses(str(exc))}"), exc
        ) from exc


def encode_json_payload(
    value: Any, *, threshold: int = COMPRESS_THRESHOLD
) -> tuple[ViewEncoding, bytes]:
    """orjson bytes of ``value``, zstd-compressed when above ``threshold``."""
    return _compress_maybe(_dumps(value, "payload"), threshold)


def decode_json_payload(encoding: str, payload: bytes) -> Any:
    """Inverse of :func:`encode_json_payload`."""
    try:
        return orjson.loads(_unpack(encoding, payload))
    except orjson.JSONDecodeError as exc:
        raise raised_from(
            CodecError(f"payload is not valid JSON: {without_addresses(str(exc))}"), exc
        ) from exc
