"""A secured local broker for the security tests: SASL_SSL + SCRAM-SHA-512, TLS, ACLs.

Built from the dev broker's pieces (the same Maven jars, ``server_properties``,
JVM options): one KRaft node with

- a ``SASL_SSL`` listener (the only one the processes under test use): TLS
  with a server certificate signed by a CA generated here (``cryptography``),
  SCRAM-SHA-512 users created at storage format time;
- ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``: a
  principal can do exactly what an ACL grants;
- a ``PLAINTEXT`` listener for the controller, inter-broker traffic and the
  test harness (``User:ANONYMOUS`` is the only super user).  It stands for
  the cluster's own admin channel; no process under test connects to it.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from processor.kafka_dist import (
    DEFAULT_JVM_OPTS,
    HOST,
    LOG4J_CONFIG,
    admin_ready,
    free_ports,
    java_binary,
    random_cluster_id,
    resolve_jars,
    server_properties,
    write_properties,
)

MECHANISM = "SCRAM-SHA-512"
STORE_PASSWORD = "store-pass"


@dataclass(frozen=True)
class Pki:
    ca_pem: Path
    other_ca_pem: Path  # a CA the broker's certificate is not signed by
    keystore: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_pki(directory: Path) -> Pki:
    """A test CA, the broker's certificate for 127.0.0.1 in a PKCS12 keystore, another CA."""
    ca_key, ca_cert = _ca("processor test CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(HOST))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(HOST)), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = directory / "ca.pem"
    ca_pem.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    other = directory / "other-ca.pem"
    other.write_bytes(_ca("someone else")[1].public_bytes(serialization.Encoding.PEM))
    keystore = directory / "broker.p12"
    keystore.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"broker",
            key,
            cert,
            [ca_cert],
            serialization.BestAvailableEncryption(STORE_PASSWORD.encode()),
        )
    )
    return Pki(ca_pem, other, keystore)


class SecureBroker:
    """Start with :meth:`start`; ``users`` maps SCRAM user -> password."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = dict(users)
        self.workdir = Path(tempfile.mkdtemp(prefix="processor-secure-kafka-"))
        self.pki = make_pki(self.workdir)
        self.port, self.sasl_port, self.controller_port = free_ports(3)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def admin_bootstrap(self) -> str:
        """The harness' PLAINTEXT listener (super user)."""
        return f"{HOST}:{self.port}"

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.sasl_port}"

    def client_settings(
        self, user: str, password: str | None = None, *, ca: Path | None = None
    ) -> dict[str, str]:
        """librdkafka settings of a SASL_SSL client (the password separately in tests)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.username": user,
            "sasl.password": self.users[user] if password is None else password,
            "ssl.ca.location": str(ca or self.pki.ca_pem),
        }

    def start(self, timeout: float = 120.0) -> None:
        jars = resolve_jars()
        data = self.workdir / "data"
        jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        props = server_properties(
            self.port,
            self.controller_port,
            data,
            {
                "listeners": f"PLAINTEXT://{HOST}:{self.port},SASL_SSL://{HOST}:{self.sasl_port},"
                f"CONTROLLER://{HOST}:{self.controller_port}",
                "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port},"
                f"SASL_SSL://{HOST}:{self.sasl_port}",
                "listener.security.protocol.map": (
                    "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL"
                ),
                "sasl.enabled.mechanisms": MECHANISM,
                f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
                "ssl.keystore.location": str(self.pki.keystore),
                "ssl.keystore.type": "PKCS12",
                "ssl.keystore.password": STORE_PASSWORD,
                "ssl.key.password": STORE_PASSWORD,
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "allow.everyone.if.no.acl.found": "false",
                "super.users": "User:ANONYMOUS",
            },
        )
        path = self.workdir / "server.properties"
        write_properties(path, props)
        java = java_binary()
        jvm = [*DEFAULT_JVM_OPTS, f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"]
        scram = [
            arg
            for user, password in self.users.items()
            for arg in ("--add-scram", f"{MECHANISM}=[name={user},password={password}]")
        ]
        fmt = subprocess.run(
            [
                java,
                *jvm,
                "-cp",
                str(jars / "*"),
                "kafka.tools.StorageTool",
                "format",
                "-t",
                random_cluster_id(),
                "-c",
                str(path),
                *scram,
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if fmt.returncode != 0:
            raise RuntimeError(f"format failed: {fmt.stdout}{fmt.stderr}")
        log = open(self.workdir / "broker.log", "wb")  # noqa: SIM115 - the broker's stdout
        self._proc = subprocess.Popen(
            [java, *jvm, "-cp", str(jars / "*"), "kafka.Kafka", str(path)],
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not admin_ready(self.admin_bootstrap, 3.0):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.workdir / "broker.log").read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"secure broker did not start:\n{tail}")
            time.sleep(0.3)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> SecureBroker:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
