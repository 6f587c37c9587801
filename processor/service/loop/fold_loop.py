"""The loop's per-record work: consumed messages into the engine's fold.

Compiled with mypyc (setup.py ``MYPYC_MODULES``, figure 2): interpreted,
this loop's frame -- a ``Record`` built from seven accessor calls and the
``fold`` call, per record -- was most of what the interpreter still ran per
event (figure 2).  The runner calls it once per poll.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaException

from processor.core.errors import Unavailable
from processor.engine import Engine, Record
from processor.kafka.transport import Msg

log = logging.getLogger(__name__)


def fold_messages(engine: Engine, msgs: Iterable[Msg], consume_error: Callable[[Msg], None]) -> int:
    """Fold ``msgs`` into the engine's open batch; how many were folded.

    An error in a record's place goes to ``consume_error``; a record of a
    partition not (or no longer) owned is skipped (fetched just before a
    revoke).  A failure interpreting one record is that record's dead letter;
    a failure of the run's (the store, a restore's anchor, the client, a
    dependency gone such as the schema registry) ends it.
    """
    parts = engine.partitions
    offsets = engine.batch.offsets
    consumed = 0
    for msg in msgs:
        if msg.error() is not None:
            consume_error(msg)
            continue
        number = msg.partition() or 0
        part = parts.get(number)
        if part is None:
            continue
        consumed += 1
        offset = msg.offset()
        ts = msg.timestamp()[1]
        # a broker-less timestamp is now
        rec = Record(
            msg.topic() or "",
            number,
            offset if offset is not None else -1,
            msg.key(),
            msg.value(),
            ts if ts > 0 else int(time.time() * 1000),
        )
        try:
            engine.fold(part, rec)
        # the run's, not the record's: the client, or a dependency gone (Unavailable:
        # the store, a restore's anchor, the schema registry)
        except (KafkaException, Unavailable):
            raise
        except Exception as exc:  # one record's failure is that record's dead letter
            log.exception(
                "record %s[%d]@%d could not be interpreted", rec.topic, number, rec.offset
            )
            engine.fail(part, rec, exc)
        offsets[number] = rec.offset + 1
    return consumed


def record_of(msg: Msg) -> Record:
    """A consumed message as the engine sees it (a broker-less timestamp is now)."""
    ts = msg.timestamp()[1]
    offset = msg.offset()
    return Record(
        msg.topic() or "",
        msg.partition() or 0,
        offset if offset is not None else -1,
        msg.key(),
        msg.value(),
        ts if ts > 0 else int(time.time() * 1000),
    )
