"""Figure 4: replay from offset zero into fresh topics vs the ceiling.

Per run, back to back: the ceiling (figure 1's bare consumer), then
``processor.client.replayer.replay(config, into_prefix=<fresh>)`` — the
blue/green form: a new group folds the whole events topic into
``<fresh>.views/.checkpoints/.dlq``.  The replay rate is
``ReplayResult.events / ReplayResult.seconds`` (its own clock: the
Processor's whole run, start-up and group join included); the ceiling is
shown with its wall time (start-up included) too, for a like-for-like ratio.
"""

from __future__ import annotations

from typing import Any

from bench.common import Context, measure, ratio, result, unique, wait_topics_ready
from bench.throughput import ceiling
from processor.client.replayer import replay
from processor.kafka import clients
from processor.kafka.topic_admin import create_topics


def run(ctx: Context) -> dict[str, Any]:
    wl = ctx.workload
    replays: list[float] = []
    ceilings: list[float] = []
    ceilings_wall: list[float] = []
    for _ in range(ctx.runs):
        c = ceiling(ctx.config(topic_prefix=wl.prefix), wl.highs)
        ceilings.append(c.rate)
        ceilings_wall.append(c.wall_rate)
        into = unique("bench-replay")
        config = ctx.config(topic_prefix=wl.prefix, group_id=unique("bench-replay-group"))
        # pre-create the fresh topics (replay would too) and let their leaders settle
        target = config.with_overrides(
            topic_prefix=into, events_topic=wl.events_topic, partitions=len(wl.highs)
        )
        create_topics(clients.admin(target), target)
        t = target.topics
        wait_topics_ready(target, [t.views, t.checkpoints, t.dlq])
        res = replay(config, into_prefix=into)
        if res.events != wl.events:
            raise RuntimeError(f"replay folded {res.events} of {wl.events} events")
        replays.append(res.events / res.seconds)
    r = ratio("replay / ceiling (wall, start-up included on both sides)", replays, ceilings_wall)
    r_steady = ratio("replay (wall) / ceiling (first record -> end)", replays, ceilings)
    return result(
        ctx,
        "replay",
        "Replay from offset zero into fresh topics vs the ceiling",
        workload=wl.describe(),
        value=measure(
            "replay(into_prefix=fresh): events / ReplayResult.seconds", "events/s", replays
        ),
        baseline=measure("ceiling, wall incl. start-up", "events/s", ceilings_wall),
        ratio=r,
        targets=[{"text": "no target; reported as a ratio to the ceiling", "met": None}],
        rows=[
            ["ceiling, first record -> end (events/s)", _fmt(measure("", "", ceilings))],
            [r_steady["label"], _fmt(r_steady)],
        ],
    )


def _fmt(m: dict[str, Any]) -> str:
    return f"{m['median']:g} (min {m['min']:g}, max {m['max']:g})"
