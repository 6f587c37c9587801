"""The checkpoints a partition restores from, out of the checkpoints topic's records.

One place turns the (key, value) records of a checkpoints partition, read
from the start, into the newest usable checkpoint per session: the Kafka
restore and the broker-less tests (compaction simulated) call the same
function, so a format change cannot split them.

Two formats: a format-1 ``Checkpoint`` record holds a whole session; a
format-2 ``CheckpointHead`` names the parts it is made of (checkpoint_parts.py,
keys ``0xFF + session + 0x00 + name``).  A head is assembled from the newest
record of every part it names; a part that is missing, unreadable or at
another version than the head names makes that session's checkpoint
unusable: it is reported like an unreadable record and the session refolds.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from processor.codec import (
    CHECKPOINT,
    Anchor,
    Checkpoint,
    Codec,
    CodecError,
    decode_checkpoint_record,
    decode_json_payload,
    decode_part,
    shared_string,
    split_part_key,
)
from processor.core.errors import library_text
from processor.engine.checkpoint_parts import decode_leaves, digest_part
from processor.protocol import CHUNK_ITEMS, SERVICE_STATE_VERSION


@dataclass
class RestoredCheckpoints:
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    records_read: int = 0
    bad_records: int = 0


def latest_checkpoints(
    codec: Codec,
    records: Iterable[tuple[bytes | None, bytes | None]],
    on_bad: Callable[[str, CodecError], None] | None = None,
) -> RestoredCheckpoints:
    """Newest checkpoint per session of ``records`` in log order (tombstones remove).

    An unreadable newest head, or a head whose parts are not all readable,
    drops its session's checkpoint (it is refolded) and is reported through
    ``on_bad``; it never stops the restore.  Superseded heads are not
    decoded (nor reported when unreadable: nothing restores from them).
    """
    result = RestoredCheckpoints()
    # the newest head per session, still encoded: a topic not compacted yet
    # holds a head per batch, and only the last one is ever decoded
    raw_heads: dict[str, bytes] = {}
    parts: dict[tuple[str, str], bytes] = {}
    bundles: dict[str, set[str]] = {}  # session -> its live bundle parts ``b.<n>``

    def bad(sid: str, exc: CodecError) -> None:
        result.bad_records += 1
        if on_bad is not None:
            on_bad(sid, exc)

    for key, value in records:
        result.records_read += 1
        if key is None:
            continue
        ident = split_part_key(key)
        if ident is not None:
            if value is None:
                parts.pop(ident, None)
                if ident[1].startswith("b."):
                    bundles.get(ident[0], set()).discard(ident[1])
            else:
                parts[ident] = value
                if ident[1].startswith("b."):
                    bundles.setdefault(ident[0], set()).add(ident[1])
            continue
        sid = key.decode("utf-8", "replace")
        if value is None:
            raw_heads.pop(sid, None)
        else:
            raw_heads[sid] = value
    heads: dict[str, Checkpoint | dict[str, Any]] = {}
    for sid, value in raw_heads.items():
        try:
            name, datum = decode_checkpoint_record(codec, value)
            heads[sid] = codec.decode_checkpoint(value) if name == CHECKPOINT else datum
        except CodecError as exc:
            bad(sid, exc)
    for sid, head in heads.items():
        if isinstance(head, Checkpoint):
            result.checkpoints[sid] = head
            continue
        try:
            result.checkpoints[sid] = _assemble(codec, sid, head, parts, bundles.get(sid, ()))
        except CodecError as exc:
            bad(sid, exc)
        except (KeyError, TypeError, ValueError) as exc:  # a part of the wrong shape
            bad(sid, CodecError(f"malformed checkpoint part: {library_text(exc)}"))
    return result


class _Parts:
    """The parts of one session, decoded on demand; remembers every name read.

    A part is an entry of a bundle ``b.<n>`` (format 3) or a record of its
    own (format 2, and ``r.<i>``, ``x.<i>`` always): every live bundle of the
    session is decoded once; the newest bundle listing a name wins over
    older ones and over a record of its own (which a bundle entry
    supersedes, its tombstone being in the same transaction).
    """

    def __init__(
        self,
        codec: Codec,
        sid: str,
        parts: Mapping[tuple[str, str], bytes],
        bundles: Iterable[str] = (),
    ) -> None:
        self.codec, self.sid, self.parts = codec, sid, parts
        self.names: list[str] = []
        self.entries: dict[str, tuple[int, Any, int]] = {}  # entry -> (bundle, value, version)
        self.standalone: list[str] = []  # names read from records of their own
        self.bundles: dict[int, list[str]] = {}  # every live bundle -> the entries read
        for name in sorted(bundles, key=lambda b: int(b[2:])):
            n = int(name[2:])
            _, _, items = decode_part(codec, parts[(sid, name)])
            if not isinstance(items, list):
                raise CodecError(f"checkpoint part {name} is not a list")
            self.bundles[n] = []
            for entry in items:
                if not isinstance(entry, list) or len(entry) not in (2, 3):
                    raise CodecError(f"checkpoint part {name} holds a malformed entry")
                self.entries[str(entry[0])] = (n, entry[1], int(entry[2]) if len(entry) == 3 else 0)

    def get(self, name: str, version: int | None = None) -> Any:
        hit = self.entries.get(name)
        if hit is not None:
            n, value, have = hit
            if version is not None and have != version:
                raise CodecError(
                    f"checkpoint part {name} (in b.{n}) is at version {have}, "
                    f"the head needs {version}"
                )
            self.bundles[n].append(name)
            self.names.append(f"b.{n}")
            return value
        raw = self.parts.get((self.sid, name))
        if raw is None:
            raise CodecError(f"checkpoint part {name} is missing")
        self.standalone.append(name)
        _, have, value = decode_part(self.codec, raw)
        if version is not None and have != version:
            raise CodecError(
                f"checkpoint part {name} is at version {have}, the head needs {version}"
            )
        self.names.append(name)
        return value

    def views_bundles(self) -> list[list[Any]]:
        """``[n, pinned, names]`` of every views bundle the entries ``vb.<n>`` describe."""
        found = []
        for name in [e for e in self.entries if e.startswith("vb.")]:
            pinned, names = self.get(name)
            found.append([int(name[3:]), bool(pinned), [str(x) for x in names]])
        return sorted(found)

    def chunked(self, kind: str, spec: Mapping[str, Any]) -> list[Any]:
        items: list[Any] = []
        for i, version in enumerate(spec["chunks"]):
            chunk = self.get(f"{kind}.{i}", version)
            if not isinstance(chunk, list):
                raise CodecError(f"checkpoint part {kind}.{i} is not a list")
            items.extend(chunk)
        items.extend(spec["tail"])
        return items


def _shared_types(event: Any) -> Any:
    """A decoded event part with its ``type`` and ``surfaceOp`` shared, as a
    consumed event's are (codec/envelope.py): one ``"message"`` or ``"append"``
    in all loaded sessions, not a copy per held event (~0.5 KB a session)."""
    if type(event) is dict:
        for key in ("type", "surfaceOp"):
            value = event.get(key)
            if type(value) is str:
                event[key] = shared_string(value)
    return event


def _assemble(
    codec: Codec,
    sid: str,
    h: Mapping[str, Any],
    stored: Mapping[tuple[str, str], bytes],
    bundles: Iterable[str] = (),
) -> Checkpoint:
    """A format-2 head and its parts as the checkpoint the engine restores from."""
    last = int(h["lastSeq"])
    views = h["views"]
    parts = _Parts(codec, sid, stored, bundles)
    nodes = parts.chunked("n", h["nodes"])
    headers = parts.chunked("h", h["headers"])
    overrides = [[o["seq"], parts.get(f"o.{o['seq']}.{o['generation']}")] for o in h["overrides"]]
    rows = {}
    keys = parts.get("k", h["unitKeys"])
    if len(keys) != len(h["units"]):
        raise CodecError(f"checkpoint part k names {len(keys)} units, the head {len(h['units'])}")
    ledger = []  # (key, part version or None, inline, the part's row)
    for key, unit in zip(keys, h["units"], strict=True):
        if unit["row"] is not None:  # schema version 1: a whole row, no part
            row = base = decode_json_payload("JSON", unit["row"])
            ledger.append([key, None, True, None])
        else:
            base = parts.get(f"u.{key}", last - unit["age"])
            leaves = unit.get("leaves")
            row = (
                base if leaves is None else decode_leaves(base, decode_json_payload("JSON", leaves))
            )
            ledger.append([key, last - unit["age"], leaves is not None, base])
        rows[key] = {"ver": row["ver"], "seq": last, "val": row["val"]}
    size = int(h["digestBlock"])
    blocks = list(range(h["digestFirstBlock"], (last + 1) // size))
    digests = b"".join(base64.b64decode(parts.get(digest_part(b, size))) for b in blocks)
    surface = {
        "nextSeq": last + 1,
        "nodes": nodes,
        "nodeEvents": [_shared_types(parts.get(f"e.{s}")) for s in nodes],
        "headers": [_shared_types(parts.get(f"e.{s}")) for s in headers],
        "overrides": overrides,
        "replacements": [parts.get(f"r.{i}") for i in range(h["replacements"])],
        "projectionTypesUsed": list(h["projectionTypesUsed"]),
        "replaceGeneration": h["replaceGeneration"],
        "contentGeneration": h["contentGeneration"],
    }
    chunks = (views["transcriptTotal"] - views["transcriptBase"]) // CHUNK_ITEMS
    seqs_from = chunks if views["seqChunksFrom"] < 0 else views["seqChunksFrom"]
    seqs = [s for i in range(seqs_from, chunks) for s in parts.get(f"x.{i}")]
    header = parts.get("hdr")
    a = h["anchor"]
    core = {
        "version": h["coreVersion"],
        "lastSeq": last,
        "lastDigest": a["digest"].hex() if a["digest"] else None,
        "surface": surface,
        "transcriptBase": views["transcriptTotal"],
        "transcript": [{"seq": s, "message": parts.get(f"t.{s}")} for s in views["pending"]],
    }
    service = {
        "version": SERVICE_STATE_VERSION,
        "lastOffset": h["lastOffset"],
        "quarantine": h["quarantine"],
        "redriveAt": h["redriveAt"],
        "liftedAt": h["liftedAt"],
        "digests": base64.b64encode(digests + h["digestTail"]).decode(),
        "published": {"transcript": views["transcriptTotal"]},
        "parted": {
            "overrides": [[o["seq"], o["generation"]] for o in h["overrides"]],
            "units": ledger,
            "unitKeys": h["unitKeys"],
            "nodeChunks": h["nodes"]["chunks"],
            "headerChunks": h["headers"]["chunks"],
            "digestBlocks": blocks,
            "digestSize": size,
            "views": views,
            "seqChunksFrom": seqs_from,
            "transcriptSeqs": [*seqs, *views["transcriptTail"]],
            "partNames": sorted(set(parts.names) | {f"b.{n}" for n in parts.bundles}),
            "viewBundles": parts.views_bundles(),
            "partBundles": [[n, sorted(set(read))] for n, read in sorted(parts.bundles.items())],
            "standalone": sorted(
                {n for n in parts.standalone if not n.startswith(("e.", "o.", "r.", "x."))}
            ),
        },
    }
    return Checkpoint(
        sid,
        last,
        Anchor(a["partition"], a["offset"], a["seq"], a["digest"]),
        rows,
        {"core": core, "service": service, "header": header},
        h["coreVersion"],
    )
