"""Dead letters that always fit the DLQ.

A dead letter carries the refused record's bytes so it can be inspected and
re-driven, but a record may be as large as the events topic allows, and a
dead letter that cannot be written would abort its transaction forever and
stall the partition.  Above :data:`MAX_COPIED_VALUE` the value is not
copied: the letter references the record by (topic, partition, offset) and
states its size and SHA-256, which is enough to fetch and verify it.  Keys,
reasons and session ids are bounded the same way.
"""

from __future__ import annotations

import hashlib
from typing import Final

from processor.codec import DeadLetter

#: Largest record value copied into a dead letter (well under the producer's
#: default message.max.bytes of 1,000,000 with the rest of the letter).
MAX_COPIED_VALUE: Final = 512 * 1024
#: Largest record key copied (and the largest key the processor accepts as a session id).
MAX_KEY_BYTES: Final = 1024
MAX_REASON_CHARS: Final = 2000
#: Dead-letter bytes one batch holds at most before the loop commits it (plus
#: one consume call's records).  Each letter fits, but a flood of poison records
#: just under MAX_COPIED_VALUE in a backlog filled a batch of max_batch_events
#: letters (20,000 x 512 KiB: 10 GiB in memory, one transaction that cannot
#: finish within its timeout, aborted and refolded for ever).
MAX_BATCH_DEAD_LETTER_BYTES: Final = 64 * 1024 * 1024


def reference(data: bytes) -> str:
    return f"{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 20] + f"... [{len(text)} chars]"


def bounded(letter: DeadLetter) -> tuple[DeadLetter, bool]:
    """The letter with oversized parts replaced by references; True when the value was."""
    notes: list[str] = []
    value, key = letter.value, letter.key
    referenced = value is not None and len(value) > MAX_COPIED_VALUE
    if value is not None and referenced:
        notes.append(
            f"value not copied ({reference(value)}); read it at {letter.topic}"
            f"[{letter.partition}]@{letter.offset}"
        )
        value = None
    if key is not None and len(key) > MAX_KEY_BYTES:
        notes.append(f"key not copied ({reference(key)})")
        key = None
    sid = letter.session_id
    if sid is not None and len(sid.encode()) > MAX_KEY_BYTES:
        sid = None
    reason = _clip(letter.reason, MAX_REASON_CHARS)
    if notes:
        reason = f"{reason} [{'; '.join(notes)}]"
    rule = _clip(letter.rule, 64)
    return DeadLetter(
        session_id=sid,
        topic=letter.topic,
        partition=letter.partition,
        offset=letter.offset,
        seq=letter.seq,
        rule=rule,
        reason=reason,
        key=key,
        value=value,
        timestamp=letter.timestamp,
        processor=letter.processor,
    ), referenced
