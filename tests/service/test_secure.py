"""A secured broker (SASL_SSL + SCRAM-SHA-512, TLS, StandardAuthorizer, no allow-everyone).

- processor, writer, reader and operator run with exactly the ACLs of
  ``processor.kafka.acls`` (the README's table) — the whole path works,
  and a writer cannot forge an operator command;
- each ACL of the processor is needed: without it ``processor run`` ends
  within seconds with one line naming it and exit status 1;
- a wrong password, an untrusted CA, and a WRITE revoked while running end
  the same way; the password never appears on the command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from processor.children import popen_tied
from processor.client.session_writer import DeliveryError, SessionWriter
from processor.client.views_reader import (
    materialize_views,
    offline_equivalent,
    read_dead_letters,
    session_fold_equivalent,
)
from processor.codec import default_codec
from processor.config import ServiceConfig
from processor.core.builder import LogBuilder
from processor.core.events import Event
from processor.kafka import clients
from processor.kafka.acls import Acl, Role, required_acls
from processor.kafka.topic_admin import create_topics
from processor.offline import fold_events, session_output
from tests.kafka_fixtures import unique_prefix
from tests.secure_broker import SecureBroker

pytestmark = pytest.mark.kafka

REPO = Path(__file__).parents[2]
USERS = {
    "proc": "proc-secret",
    "writer": "writer-secret",
    "reader": "reader-secret",
    "operator": "operator-secret",
}
ROLE_USER: dict[Role, str] = {
    "processor": "proc",
    "writer": "writer",
    "reader": "reader",
    "operator": "operator",
}
_RT = {
    "Topic": ResourceType.TOPIC,
    "Group": ResourceType.GROUP,
    "TransactionalId": ResourceType.TRANSACTIONAL_ID,
}


@pytest.fixture(scope="module")
def broker() -> Iterator[SecureBroker]:
    with SecureBroker(USERS) as b:
        yield b


def binding(acl: Acl, user: str) -> AclBinding:
    return AclBinding(
        _RT[acl.resource],
        acl.name,
        ResourcePatternType.PREFIXED if acl.prefixed else ResourcePatternType.LITERAL,
        f"User:{user}",
        "*",
        getattr(AclOperation, acl.operation),
        AclPermissionType.ALLOW,
    )


def setup(
    broker: SecureBroker, roles: dict[Role, list[Acl]] | None = None, *, prefix: str | None = None
) -> ServiceConfig:
    """Fresh topics (created by the admin) and the given ACLs (default: every role's)."""
    prefix = prefix or unique_prefix("sec")
    admin_cfg = ServiceConfig(
        bootstrap_servers=broker.admin_bootstrap,
        topic_prefix=prefix,
        group_id=f"{prefix}-g",
        partitions=2,
    )
    admin = AdminClient({"bootstrap.servers": broker.admin_bootstrap})
    create_topics(admin, admin_cfg)
    if roles is None:
        roles = {role: required_acls(role, admin_cfg) for role in ROLE_USER}
    bindings = [binding(acl, ROLE_USER[role]) for role, acls in roles.items() for acl in acls]
    for future in admin.create_acls(bindings).values():
        future.result()
    return admin_cfg


def produce(cfg: ServiceConfig, sid: str, events: list[Event]) -> None:
    """Events as any producer may write them (no writer-side validation)."""
    producer = clients.event_producer(cfg)
    for event in events:
        producer.produce(
            cfg.topics.events,
            key=sid.encode(),
            value=default_codec().encode_parsed_event(sid, event),
        )
    assert producer.flush(30) == 0


def as_role(
    broker: SecureBroker,
    cfg: ServiceConfig,
    role: Role,
    **settings: str,
) -> ServiceConfig:
    kafka = {**broker.client_settings(ROLE_USER[role]), **settings}
    return cfg.with_overrides(bootstrap_servers=broker.bootstrap, kafka=kafka)


def spawn(
    broker: SecureBroker,
    cfg: ServiceConfig,
    tmp_path: Path,
    *extra: str,
    password: str | None = None,
    ca: Path | None = None,
) -> subprocess.Popen[str]:
    """``processor run`` as the processor's principal; the password only in a 0600 file."""
    secret = tmp_path / f"kafka-{time.monotonic_ns()}.secret"
    secret.write_text(f"sasl.password={password or USERS['proc']}\n")
    secret.chmod(0o600)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PROCESSOR_X_SECURITY_PROTOCOL": "SASL_SSL",
        "PROCESSOR_X_SASL_MECHANISM": "SCRAM-SHA-512",
        "PROCESSOR_X_SASL_USERNAME": "proc",
        "PROCESSOR_X_SSL_CA_LOCATION": str(ca or broker.pki.ca_pem),
    }
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    cmd = [
        sys.executable,
        "-m",
        "processor",
        "run",
        "-b",
        broker.bootstrap,
        "--topic-prefix",
        cfg.topic_prefix,
        "--group-id",
        cfg.group_id,
        "--instance-id",
        "m1",
        "--commit-interval-ms",
        "100",
        "--kafka-secret-file",
        str(secret),
        *extra,
    ]
    return popen_tied(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ends_with_one_line(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    """The process exits non-zero; its last stderr line (no traceback) is returned."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"still running after {timeout}s: {err[-2000:]}") from None
    assert proc.returncode == 1, (proc.returncode, err[-2000:])
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("processor: ")]
    assert len(lines) == 1, err
    return lines[0]


def append_when_granted(writer: SessionWriter, sid: str, event: Event, timeout: float = 30) -> None:
    """ACLs reach the authorizer through the metadata log a moment after they are created."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            writer.append_event(sid, event)
            return
        except DeliveryError as exc:
            if "AUTHORIZATION" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def write_sessions(broker: SecureBroker, cfg: ServiceConfig) -> dict[str, list]:
    writer_cfg = as_role(broker, cfg, "writer")
    logs = {}
    with SessionWriter(writer_cfg) as writer:
        for sid in ("a", "b", "bad"):
            b = LogBuilder()
            b.system("careful")
            b.user(f"hi {sid}")
            for event in b.events:
                append_when_granted(writer, sid, event)
            logs[sid] = list(b.events)
        # another producer's gap quarantines "bad" (the writer role may write any event)
    produce(writer_cfg, "bad", [LogBuilder(start_seq=5).user("from elsewhere")])
    return logs


def wait_views(cfg: ServiceConfig, check: dict[str, object], timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    got: dict = {}
    while time.monotonic() < deadline:
        views = materialize_views(cfg, timeout=30)
        got = {sid: session_fold_equivalent(views[sid]) for sid in check if sid in views}
        if got == check:
            return got
        time.sleep(0.5)
    raise AssertionError(f"views did not converge: {got}")


def expected(events: list, status: str = "ok") -> dict:
    doc = offline_equivalent(session_output(fold_events(events)))
    doc["status"] = status
    return doc


def test_every_role_works_with_exactly_the_documented_acls(
    broker: SecureBroker, tmp_path: Path
) -> None:
    cfg = setup(broker)
    logs = write_sessions(broker, cfg)
    proc = spawn(broker, cfg, tmp_path)
    try:
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert USERS["proc"].encode() not in f.read()
        reader = as_role(broker, cfg, "reader")
        wait_views(
            reader,
            {
                "a": expected(logs["a"]),
                "b": expected(logs["b"]),
                "bad": expected(logs["bad"], "quarantined"),
            },
        )
        assert [d.rule for d in read_dead_letters(reader, session="bad")] == ["S-1"]

        # a writer cannot forge an operator command: only operators write control
        with (
            SessionWriter(as_role(broker, cfg, "writer")) as writer,
            pytest.raises(DeliveryError, match="(?i)authorization"),
        ):
            writer.redrive("bad", 1)
        # the operator re-drives (reading the quarantine's seq from the views)
        operator = as_role(broker, cfg, "operator")
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            **{f"PROCESSOR_X_{k.upper().replace('.', '_')}": v for k, v in operator.kafka.items()},
        }
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "processor",
                "redrive",
                "-b",
                broker.bootstrap,
                "--topic-prefix",
                cfg.topic_prefix,
                "--group-id",
                cfg.group_id,
                "bad",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and "redrive requested for bad at seq 1" in done.stdout, (
            done.stderr
        )
        fixed = LogBuilder(start_seq=2)
        fixed.user("the missing one")
        produce(as_role(broker, cfg, "writer"), "bad", fixed.events)
        wait_views(reader, {"bad": expected([*logs["bad"], *fixed.events])})
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert proc.returncode == 0


PROCESSOR_ACLS = [
    str(a) for a in required_acls("processor", ServiceConfig(topic_prefix="P", group_id="G"))
]


@pytest.mark.parametrize("index", range(len(PROCESSOR_ACLS)), ids=PROCESSOR_ACLS)
def test_each_missing_processor_acl_ends_run_with_one_line(
    broker: SecureBroker, tmp_path: Path, index: int
) -> None:
    prefix = unique_prefix("sec")
    named = ServiceConfig(topic_prefix=prefix, group_id=f"{prefix}-g")
    acls = required_acls("processor", named)
    dropped = acls.pop(index)
    cfg = setup(
        broker, {"processor": acls, "writer": required_acls("writer", named)}, prefix=prefix
    )
    write_sessions(broker, cfg)
    line = ends_with_one_line(spawn(broker, cfg, tmp_path))
    assert f"{dropped.operation} on {dropped.resource} '{dropped.name}" in line, line


def test_a_wrong_password_ends_run_with_one_line(broker: SecureBroker, tmp_path: Path) -> None:
    cfg = setup(broker)
    line = ends_with_one_line(spawn(broker, cfg, tmp_path, password="not-the-password"))
    assert "authentication with the broker failed" in line and "invalid credentials" in line


def test_an_untrusted_ca_ends_run_with_one_line(broker: SecureBroker, tmp_path: Path) -> None:
    cfg = setup(broker)
    line = ends_with_one_line(spawn(broker, cfg, tmp_path, ca=broker.pki.other_ca_pem))
    assert "TLS handshake with the broker failed" in line and "certificate verify" in line


def test_write_revoked_while_running_ends_run_with_one_line(
    broker: SecureBroker, tmp_path: Path
) -> None:
    cfg = setup(broker)
    proc = spawn(broker, cfg, tmp_path)
    try:
        reader = as_role(broker, cfg, "reader")
        logs = write_sessions(broker, cfg)
        wait_views(reader, {"a": expected(logs["a"])})
        views_write = next(
            a
            for a in required_acls("processor", cfg)
            if a.name == cfg.topics.views and a.operation == "WRITE"
        )
        admin = AdminClient({"bootstrap.servers": broker.admin_bootstrap})
        b = binding(views_write, "proc")
        flt = AclBindingFilter(
            b.restype,
            b.name,
            b.resource_pattern_type,
            b.principal,
            b.host,
            b.operation,
            b.permission_type,
        )
        for future in admin.delete_acls([flt]).values():
            future.result()
        more = LogBuilder(start_seq=2)
        more.user("after the revoke")
        produce(as_role(broker, cfg, "writer"), "a", more.events)
        line = ends_with_one_line(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert f"WRITE on Topic '{cfg.topics.views}'" in line and "checkpoints" not in line, line


def test_writer_and_ingest_with_a_wrong_password_fail_with_one_line(
    broker: SecureBroker, tmp_path: Path
) -> None:
    cfg = setup(broker)
    bad = as_role(broker, cfg, "writer", **{"sasl.password": "wrong"})
    b = LogBuilder()
    b.system("p")
    with SessionWriter(bad) as writer, pytest.raises(DeliveryError, match="invalid credentials"):
        writer.append_event("w", b.events[0])
    path = tmp_path / "w.jsonl"
    path.write_bytes(orjson.dumps(b.events[0].to_json()) + b"\n")
    secret = tmp_path / "writer.secret"
    secret.write_text("sasl.password=wrong\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PROCESSOR_X_SECURITY_PROTOCOL": "SASL_SSL",
        "PROCESSOR_X_SASL_MECHANISM": "SCRAM-SHA-512",
        "PROCESSOR_X_SASL_USERNAME": "writer",
        "PROCESSOR_X_SSL_CA_LOCATION": str(broker.pki.ca_pem),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "processor",
            "ingest",
            "-b",
            broker.bootstrap,
            "--topic-prefix",
            cfg.topic_prefix,
            "--kafka-secret-file",
            str(secret),
            str(path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "processor ingest: authentication with the broker failed" in done.stderr
