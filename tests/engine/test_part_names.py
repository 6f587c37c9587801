"""Part names are shared between held sessions, within a bound.

Seqs, unit keys and bundle names come from the input, and ``sys.intern``
keeps every string forever on Python 3.12: the sharing table stops growing
at its bound instead (later names are plain copies).
"""

from __future__ import annotations

from processor.engine import checkpoint_parts
from processor.engine.checkpoint_parts import digest_part, event_part, shared_name, unit_part


def test_part_names_are_one_copy_for_every_session() -> None:
    assert event_part(7) is event_part(7)
    assert unit_part("sessionStats") is unit_part("sessionStats")
    assert digest_part(3, 8) is digest_part(3, 8)


def test_the_shared_names_stop_growing_at_their_bound_and_count_it() -> None:
    table = checkpoint_parts.PART_NAMES
    full = table.full
    for seq in range(table.bound + 5_000):
        event_part(10_000_000 + seq)
    assert table.size() <= table.bound
    assert table.full >= full + 5_000  # each name turned away is counted
    late = "".join(["e.", "99999999999"])
    assert shared_name(late) is late  # past the bound: the caller's own copy
    assert table.full >= full + 5_001
    assert event_part(10_000_000 + 1) == "e.10000001"
