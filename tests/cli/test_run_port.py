"""``processor run`` with its HTTP port taken ends with one line, not a traceback.

A second member started on the same host with the same ``--metrics-port``
(or a process left over holding it) raised ``OSError: [Errno 98] Address
already in use`` out of the CLI with a traceback.  Nothing reaches a broker:
the port is bound before the member connects.
"""

from __future__ import annotations

import socket

from click.testing import CliRunner

from processor.cli.main import cli


def test_a_metrics_port_in_use_ends_the_start_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for extra in ((), ("--queries",)):
            result = CliRunner().invoke(
                cli,
                [
                    "run",
                    "-b",
                    "127.0.0.1:1",
                    "--topic-prefix",
                    "x",
                    "--metrics-host",
                    "127.0.0.1",
                    "--metrics-port",
                    str(port),
                    *extra,
                ],
            )
            assert isinstance(result.exception, SystemExit), (extra, result.exception)
            assert result.exit_code == 1, (extra, result.output)
            lines = result.stderr.strip().splitlines()
            assert lines == [f"processor: cannot serve on 127.0.0.1:{port}: Address already in use"]
            assert "Traceback" not in result.output
