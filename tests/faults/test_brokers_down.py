"""Every broker down: ``/readyz`` turns 503 naming it, and 200 once they are back.

With no broker the run loop still ticks (``/healthz`` stays 200, rightly: the
process is not stuck) and an idle member has no transaction to fail, so
only ``BrokerWatch`` can tell that nothing can move.  It shares the fault
suite's cluster and restarts every node it killed before it ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.client.session_writer import SessionWriter
from processor.devcluster import LocalCluster
from tests.faults.conftest import SEED, make_stack, session_plan, wait_until
from tests.local_http import free_port, get

pytestmark = pytest.mark.faults


def test_readyz_names_unreachable_brokers_and_recovers(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    stack = make_stack(cluster, tmp_path, partitions=2)
    port = free_port()
    member = stack.spawn("bd1", "--metrics-port", str(port))
    plan = session_plan(3, 20, SEED, "bd")
    try:
        with SessionWriter(stack.config, client_id="bd-writer") as writer:
            for sid, events in plan.items():
                for event in events:
                    writer.append_event(sid, event)
                    stack.written.setdefault(sid, []).append(event)
        stack.wait_caught_up(120)
        wait_until(lambda: get(port, "/readyz")[0] == 200, 60, "ready", stack.member_report)

        for node_id in list(cluster.nodes):
            cluster.kill(node_id)
        wait_until(
            lambda: get(port, "/readyz")[0] == 503,
            120,
            "/readyz 503 with every broker down",
            stack.member_report,
        )
        code, body = get(port, "/readyz")
        assert code == 503 and "no broker answers" in body, body
        assert member.alive(), stack.member_report()
    finally:
        for node_id in list(cluster.nodes):
            if not cluster.nodes[node_id].running():
                cluster.restart(node_id, wait=False)
        for node in cluster.nodes.values():
            cluster._wait_ready(node)
    try:
        wait_until(
            lambda: get(port, "/readyz")[0] == 200,
            120,
            "/readyz 200 once a broker answers",
            stack.member_report,
        )
        assert member.alive(), stack.member_report()
        stack.assert_views_equal_offline_fold()
    finally:
        stack.stop_all()
