"""clients.produce: one place for the full-local-queue wait (no broker needed)."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, Message, Producer

from processor.config import ServiceConfig
from processor.kafka import clients
from processor.kafka.client_errors import LIBRDKAFKA_LOGGER


def test_produce_waits_for_a_full_local_queue_instead_of_failing() -> None:
    # nothing listens on port 9; the one-slot queue frees when the first
    # record times out, so the second produce must wait, not raise BufferError
    producer = Producer(
        {
            "bootstrap.servers": "127.0.0.1:9",
            "queue.buffering.max.messages": 1,
            "message.timeout.ms": 300,
            "logger": LIBRDKAFKA_LOGGER,
        }
    )
    reports: list[KafkaError | None] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        reports.append(err)

    clients.produce(producer, "t", b"k", b"1", on_delivery=on_delivery)
    clients.produce(
        producer, "t", b"k", b"2", partition=0, headers=[("h", b"v")], on_delivery=on_delivery
    )
    assert reports and reports[0] is not None
    assert reports[0].code() == KafkaError._MSG_TIMED_OUT
    producer.flush(5)
    assert len(reports) == 2


def test_the_output_producer_retries_a_busy_transaction_coordinator_after_20_ms() -> None:
    # CONCURRENT_TRANSACTIONS (the previous commit's markers still being
    # written) retried after librdkafka's default 100 ms held ~10% of the
    # transactions 110-430 ms under load (figure 5)
    conf = clients.output_settings(ServiceConfig(), "unit")
    assert conf["retry.backoff.ms"] == 20
    Producer(conf)  # librdkafka takes it
    tuned = ServiceConfig(kafka={"retry.backoff.ms": "50"})  # -X still overrides it
    assert clients.output_settings(tuned, "unit")["retry.backoff.ms"] == "50"


def test_the_control_consumer_long_polls_while_read_to_end_readers_do_not() -> None:
    # the control channel stays assigned all run: at a 10 ms fetch wait an idle
    # member's empty fetches cost the broker 6.6% of a core (figure 5)
    config = ServiceConfig()
    control = clients.plain_settings(config, "control")
    assert control["fetch.wait.max.ms"] == 100
    Consumer(control)  # librdkafka takes it
    # a restore reads to the partition end: a long poll there would wait it out
    assert clients.plain_settings(config, "restore")["fetch.wait.max.ms"] == 10
    tuned = ServiceConfig(kafka={"fetch.wait.max.ms": "250"})  # -X still overrides it
    assert clients.plain_settings(tuned, "control")["fetch.wait.max.ms"] == "250"


def test_the_output_producer_reconnects_sooner_than_the_other_clients() -> None:
    # a new producer's init_transactions waited ~0.5 s at a 1 s back-off (every
    # member start, every producer replaced in a failover), and librdkafka asks
    # again for a group coordinator it cached only when a broker connection
    # comes up (issue 5511): a restarted broker is reconnected to within ~1 s
    config = ServiceConfig()
    conf = clients.output_settings(config, "unit")
    assert (conf["reconnect.backoff.ms"], conf["reconnect.backoff.max.ms"]) == (100, 1000)
    assert clients.group_settings(config, "unit")["reconnect.backoff.ms"] == 1000
    tuned = ServiceConfig(kafka={"reconnect.backoff.max.ms": "5000"})  # -X still overrides it
    assert clients.output_settings(tuned, "unit")["reconnect.backoff.max.ms"] == "5000"


def test_a_fill_consumer_reconnects_sooner_than_the_long_lived_readers() -> None:
    # made per fill job: at a 1 s back-off librdkafka waits 0.5 s before it
    # tries another bootstrap broker, and a rewind's fill made while one broker
    # was down took 0.5-1.0 s for a handful of records
    config = ServiceConfig()
    fill = clients.plain_settings(config, "fill")
    assert (fill["reconnect.backoff.ms"], fill["reconnect.backoff.max.ms"]) == (100, 1000)
    assert clients.plain_settings(config, "restore")["reconnect.backoff.ms"] == 1000
    assert clients.plain_settings(config, "control")["reconnect.backoff.ms"] == 1000
