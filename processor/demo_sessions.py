"""Sessions the demo and the benches drive through the service.

Scripted agent sessions (the reference step loop with the mock model adapter)
when the agent package provides them; each is a complete, valid log.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from processor.core.events import Event
from processor.workload import generate_session


def scripted_sessions(n: int, *, seed: int = 42, length: int = 160,
                      ) -> Iterator[tuple[str, list[Event]]]:
    """``n`` sessions ``(session id, events)``."""
    rng = random.Random(seed)
    for i in range(n):
        yield f"demo-session-{i:02d}", generate_session(random.Random(rng.random()), length)
