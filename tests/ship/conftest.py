"""The Kafka tests of ``processor ship`` use the service tests' ``stack`` fixture."""

from tests.service.conftest import stack  # noqa: F401 - a fixture, found by name
