"""The pure engine between the Kafka loop and the core (no Kafka client here).

A record's path: the loop (``service/runner.py``) turns a consumed message
into a :class:`~processor.engine.records.Record`; :meth:`Engine.fold` judges
it (key, decode, quarantine, the core's validation, the seq gate in
``gate.py``) and folds it into its session's runtime (``runtime.py``) or
dead-letters it; operator commands (``commands.py``) lift quarantines;
:meth:`Engine.output` turns the open batch into the records of one
transaction (``output.py``), which the loop produces and commits.
"""

from processor.engine.engine import Engine, Feeds, NoFeeds, PartitionState, record_session
from processor.engine.records import Batch, Fate, Out, Outcome, Record, Tally

__all__ = [
    "Batch",
    "Engine",
    "Fate",
    "Feeds",
    "NoFeeds",
    "Out",
    "Outcome",
    "PartitionState",
    "Record",
    "Tally",
    "record_session",
]
