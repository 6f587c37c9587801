"""The commit protocol: one transaction per batch, or its abort and rewind.

``commit`` produces what the engine's open batch turned into (views, checkpoints,
dead letters, tombstones), sends the consumer offsets (naming their writer, for
``kafka/fencing.py``) into the transaction and commits — all visible together
or not at all.  Only then are the checkpoint records applied to the local store
(``checkpoint_store.py``): a crash in between leaves the store behind, never ahead.

Errors follow confluent-kafka's model (``kafka/client_errors.py``): retriable
steps are retried, abortable ones abort, rewind and back off (bounded,
``failures.py``), fatal ones end the run with one line — except a fatal
producer error a broker fault explains, answered with a new producer
(``replace_producer``).  While revoking, every wait is cut by what is left
of ``revoke_budget_ms`` (:meth:`left`): each step's timeout, the back-off
between retried steps, the abort's attempts, a new producer's
``init_transactions`` (what misses it is finished before the next
transaction, out of the rebalance).

``commit_transaction`` overlaps the next batch (``commit(overlap=True)``):
it runs, with the flush that serves the store's delivery reports, on the
helper thread while the loop consumes and folds the next batch; the loop
finishes it (:meth:`settle`) before anything needs it done — the next
``begin_transaction``, a revoke's commit, an abort, shutdown, an eviction.
A failed commit aborts and rewinds both batches' partitions: the open one
was folded on top of the failed one.

Threads: the helper thread calls only the producer (librdkafka is
thread-safe) and appends to the ledger's reports (``output_ledger.py``);
the store, the engine, the query cache and the metrics are touched on the
loop thread only, in :meth:`settle`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, wait

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processor.config import ServiceConfig
from processor.core.errors import ProcessorError
from processor.engine import Batch, Engine, Out, Tally
from processor.kafka import preflight
from processor.kafka.client_errors import GROUP_CHANGED, KafkaFatal, Kind, error_of
from processor.kafka.fencing import writer_metadata
from processor.kafka.group_metadata import outside_group
from processor.kafka.retry import DEFAULT_DEADLINE_S as RETRY_DEADLINE_S
from processor.kafka.retry import FENCED, STOPPING, FatalBudget, ReplacementBudget, retry
from processor.kafka.transport import GroupConsumer, TxnProducer
from processor.service.loop.member_clients import MemberClients
from processor.service.ops.failures import FailureTracker
from processor.service.queries.query_cache import QueryCache, ViewWrite
from processor.service.store.checkpoint_store import CheckpointStore
from processor.service.txn import schedstat, transactions, txn_helper
from processor.service.txn.inflight import InFlight as _InFlight
from processor.service.txn.inflight import Rewinder
from processor.service.txn.output_ledger import OutputLedger
from processor.service.txn.stuck_probe import StuckProbe
from processor.service.txn.timeline import Timeline, log_timeline
from processor.service.txn.txn_helper import OFFSETS_TIMEOUT_S, HelperThread, StuckCall
from processor.telemetry.metrics import Metrics
from processor.testing import faultpoints

log = logging.getLogger(__name__)


class Committer:
    """The output producer and the transaction of the open batch."""

    def __init__(
        self,
        config: ServiceConfig,
        clients: MemberClients,
        engine: Engine,
        store: CheckpointStore,
        metrics: Metrics,
        *,
        queries: QueryCache | None,
        rewinder: Rewinder,
        fail: Callable[[ProcessorError], ProcessorError],
        stop: threading.Event,
    ) -> None:
        """``queries``: the views of the owned partitions for queries by session
        (fed each committed batch's views); ``rewinder``: restores partitions
        after an abort."""
        self.config = config
        self.clients = clients
        self.engine = engine
        self.store = store
        self.metrics = metrics
        self.problems = clients.problems
        self.instance_id = clients.instance_id
        self.queries = queries
        self._rewinder = rewinder
        self._fail = fail
        self._stop = stop
        self.failures = FailureTracker(metrics)
        self.fatal_budget = FatalBudget()
        self.leaving: set[int] = set()  # partitions being revoked (during on_revoke)
        #: while revoking: the monotonic time the revoke's commit must end by
        #: (``revoke_budget_ms``; the derived transaction timeout assumes it)
        self.deadline: float | None = None
        #: monotonic time a transaction failed after being open past the
        #: transaction timeout (a SIGSTOP, a stalled host): the coordinator
        #: aborted it itself and bumped the producer epoch, so the next fence is
        #: the coordinator's, not another member's (``replace_producer``)
        self.overran_at: float | None = None
        #: monotonic time of the last ``replace_producer`` (the fence verdict names it)
        self.replaced_at: float | None = None
        #: a producer replaced during a revoke whose transactions were not
        #: initialised within the revoke's budget: finished before the next
        #: transaction (:meth:`_initialised`)
        self.init_pending = False
        #: the open transaction's records and the store's delivery reports
        self.ledger = OutputLedger(config, store, self.problems)
        #: sends a batch's offsets while the loop produces its output, and commits
        #: a batch while the loop folds the next one (commit)
        self.helper = HelperThread("txn-helper")
        #: replacements after a stuck ``send_offsets_to_transaction``: bounded by
        #: the given-up calls still hanging, apart from ``fatal_budget``
        self.stuck_budget = txn_helper.HangingBudget(self.helper)
        metrics.txn_calls_hanging.set_function(self.helper.hanging)
        #: ``send_offsets_to_transaction``'s timeout, and how far past it a call
        #: counts as stuck for good (:meth:`_await_offsets`)
        self.offsets_timeout_s = OFFSETS_TIMEOUT_S
        #: judges a long send_offsets_to_transaction stuck before its timeout
        self.stuck_probe = StuckProbe(config, clients, engine, self.stuck_budget)
        #: the batch being committed on the helper thread (settle finishes it)
        self._inflight: _InFlight | None = None
        self.timeline = Timeline()
        #: a batch committed since the loop last asked (:meth:`take_committed`)
        self._fresh = False

    @property
    def txn_id(self) -> str:
        return f"{self.config.group_id}-{self.instance_id}"

    @property
    def producer(self) -> TxnProducer | None:
        return self.clients.producer

    @property
    def consumer(self) -> GroupConsumer | None:
        return self.clients.consumer

    def start(self) -> None:
        """The run's clients are open: initialise the producer's transactions."""
        producer = self.producer
        assert producer is not None, "MemberClients.open first"
        self.timeline.start()
        if self.config.exactly_once:
            transactions.init(producer, self.problems, self.txn_id, deadline_s=RETRY_DEADLINE_S)
            self.stuck_probe.txn_answered()

    @contextlib.contextmanager
    def revoking(self, partitions: Iterable[int]) -> Iterator[None]:
        """Revoking ``partitions``: within ``revoke_budget_ms``, rewinding only the kept."""
        self.leaving = set(partitions)
        self.deadline = time.monotonic() + self.config.revoke_budget_ms / 1000
        try:
            yield
        finally:
            self.leaving = set()
            self.deadline = None

    def left(self, *, in_flight: bool = False) -> float | None:
        """Seconds left of the revoke budget (``None``: not revoking; <= 0:
        spent).  ``in_flight``: of its first half (see :meth:`timeout`)."""
        deadline = self.deadline  # read once: the loop thread clears it
        if deadline is None:
            return None
        if in_flight:
            deadline -= self.config.revoke_budget_ms / 2000
        return deadline - time.monotonic()

    def timeout(self, default_s: float, *, in_flight: bool = False) -> float:
        """A transaction step's timeout: ``default_s``, or what is left of the
        revoke budget while revoking (a shutdown revokes too), so a revoke
        never outlasts the budget the transaction timeout was sized for.
        ``in_flight``: a step of the overlapped commit the revoke waits for,
        which gets the first half of the budget only; the revoke's own commit
        keeps the second half (else the in-flight flush could take it all and
        leave the revoke's commit 0.1 s steps, which abort)."""
        left = self.left(in_flight=in_flight)
        if left is None:
            return default_s
        return max(0.1, min(default_s, left))

    # ------------------------------------------------------------ commit

    def close(self) -> None:
        """End the helper thread (the loop has ended); an in-flight commit is waited
        for, not applied (the store stays behind, caught up on the next assignment)."""
        flight, self._inflight = self._inflight, None
        if flight is not None:
            wait((flight.future,), timeout=self.timeout(60))
        self.helper.shutdown()

    def _send_offsets(self, offsets: list[TopicPartition]) -> Future[None]:
        """``send_offsets_to_transaction`` (retried), on the helper thread."""
        producer, consumer = self.producer, self.consumer
        assert producer is not None and consumer is not None
        group = consumer.consumer_group_metadata()  # on this thread: the consumer's owner
        refused = outside_group(group)  # offsets the coordinator would not check
        if refused is not None:
            self.metrics.commits_outside_group.inc()
            raise refused  # the batch aborts; the next poll serves the lost partitions

        def call() -> None:
            timeout_s = self.timeout(self.offsets_timeout_s)
            self.helper.watch(timeout_s)
            producer.send_offsets_to_transaction(offsets, group, timeout_s)

        def send() -> None:
            try:
                transactions.retrying(call, self.metrics, left=self.left)
            finally:
                self.helper.unwatch()

        return self.helper.submit(send)

    def _await_offsets(self, sent: Future[None]) -> None:
        """Wait for the helper's ``send_offsets_to_transaction``; a call stuck
        on a coordinator that went away (``txn_helper.py``, ``stuck_probe.py``)
        raises a fatal error: the stuck producer can take no other transaction
        call, not even an abort, so ``replace_producer`` fences it and the
        batch is refolded; the stuck helper is left to it."""
        self.helper.await_watched(sent, "send_offsets_to_transaction", self.stuck_probe)

    def committing(self) -> Mapping[tuple[int, str], object] | None:
        """The sessions of the batch whose commit is in flight (None: none is):
        not in the store yet, so not to be evicted (``Engine.evict``)."""
        flight = self._inflight
        return flight.batch.dirty if flight is not None else None

    @property
    def in_flight(self) -> bool:
        """A commit runs on the helper thread (the store and metrics lag it)."""
        return self._inflight is not None

    @property
    def busy(self) -> bool:
        """The in-flight commit has not ended yet (the next one would wait for it)."""
        flight = self._inflight
        return flight is not None and not flight.future.done()

    def wait_in_flight(self, timeout_s: float) -> None:
        """Until the in-flight commit ends, ``timeout_s`` at most (not settled)."""
        flight = self._inflight
        if flight is not None:
            wait((flight.future,), timeout=timeout_s)

    def poll(self) -> None:
        """Finish the in-flight commit if it has ended (the loop, every slice)."""
        if self._inflight is not None and self._inflight.future.done():
            self.settle()

    def settle(self) -> None:
        """Wait for the in-flight commit and finish it: apply it to the store, the
        query cache and the metrics — or, if it failed, abort and rewind its
        partitions and the open batch's (folded on top of it)."""
        flight, self._inflight = self._inflight, None
        if flight is None:
            return
        wait((flight.future,))  # bounded: its steps' timeouts, cut by a revoke's deadline
        exc = flight.future.exception()
        if exc is None:
            self._committed(flight.batch, flight.views, flight.tally, flight.done_at - flight.t0)
            return
        if not isinstance(exc, KafkaException):
            raise exc
        self._failed(exc, flight.opened, flight.batch)

    def commit(self, *, overlap: bool = False) -> None:
        """Commit the open batch.  ``overlap``: leave ``commit_transaction`` on
        the helper thread (the loop's normal commit; a revoke or shutdown waits)."""
        marks, sched = self.timeline.close_marks()
        self.settle()  # never two transactions at once
        pending = self.engine.batch
        if pending.empty() or self.producer is None or self.consumer is None:
            return
        if marks:
            marks.insert(0, ("opened", pending.started))
            marks.append(("settled", time.monotonic()))
        if not self._initialised():  # a revoke's budget ran out first: retried next batch
            self.abort(pending.partitions())
            return
        t0 = time.perf_counter()
        opened = time.monotonic()  # counts a SIGSTOP too, as the coordinator's timeout does
        producer, consumer = self.producer, self.consumer
        topics = self.config.topics
        eos = self.config.exactly_once
        views: list[ViewWrite] = []  # for the query cache once committed
        self.ledger.forget()
        try:
            if eos:
                producer.begin_transaction()
            if marks:
                marks.append(("begun", time.monotonic()))
            meta = writer_metadata(self.instance_id)
            given = ((topics.events, pending.offsets), (topics.control, pending.control_offsets))
            offsets = [
                TopicPartition(topic, p, o, metadata=meta)
                for topic, at in given
                for p, o in at.items()
            ]
            # The offsets go into the transaction on a helper thread while this
            # one builds and produces the output: send_offsets_to_transaction
            # waits two broker round trips (AddOffsetsToTxn, TxnOffsetCommit),
            # 20-25% of a transaction on a loaded box (figure 5).  Both
            # are inside the one transaction, so the order does not matter.
            # (Not under the fault point that needs them unsent.)
            early = eos and offsets and not faultpoints.configured(faultpoints.BEFORE_SEND_OFFSETS)
            sent = self._send_offsets(offsets) if early else None
            # Without transactions a delivered record is visible at once, and a
            # checkpoint claims the views it names were published: checkpoints go
            # out only after every view and dead letter of the batch is delivered.
            later: list[Out] = []
            try:
                for out in self.engine.output():
                    if not eos and out.topic == topics.checkpoints:
                        later.append(out)
                        continue
                    self.ledger.produce(producer, out.topic, out.partition, out.key, out.value)
                    if self.queries is not None and out.topic == topics.views and out.key:
                        views.append((out.partition, out.key, out.value))
                self.ledger.release(producer)
                if marks:
                    marks.append(("produced", time.monotonic()))
            finally:
                if sent is not None:  # never two transaction calls at once, not even an abort
                    self._await_offsets(sent)
            if eos:
                faultpoints.hit(faultpoints.BEFORE_SEND_OFFSETS, lambda: producer.flush(30))
                if sent is not None:
                    sent.result()  # raises what send_offsets_to_transaction raised
                elif offsets:
                    sent = self._send_offsets(offsets)
                    self._await_offsets(sent)
                    sent.result()
                if marks:
                    marks.append(("offsets", time.monotonic()))
                    sched += self.timeline.loop_waits()
                if overlap and not faultpoints.configured(faultpoints.AFTER_COMMIT):
                    self._hand_off(pending, views, t0, opened, marks, sched)
                    return
                transactions.retrying(
                    lambda: producer.commit_transaction(self.timeout(60)),
                    self.metrics,
                    left=self.left,
                )
            else:
                transactions.delivered_all(producer, self.problems, self.timeout(60))
                for out in later:
                    self.ledger.produce(producer, out.topic, out.partition, out.key, out.value)
                self.ledger.release(producer)
                transactions.delivered_all(producer, self.problems, self.timeout(60))
                if self.queries is not None:  # delivered = visible without transactions
                    self.queries.committed(views)
                    views = []
                if offsets:
                    consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self._failed(exc, opened, pending)
            return
        # committed: every record is delivered, flush serves the reports the
        # store is written from
        producer.flush(self.timeout(10))
        faultpoints.hit(faultpoints.AFTER_COMMIT)
        _, tally = self.engine.close_batch()
        self._committed(pending, views, tally, time.perf_counter() - t0)

    def _hand_off(
        self,
        pending: Batch,
        views: list[ViewWrite],
        t0: float,
        opened: float,
        marks: list[tuple[str, float]],
        sched: list[tuple[str, float]],
    ) -> None:
        """Commit on the helper thread; the loop goes on with a new batch."""
        producer = self.producer
        assert producer is not None
        # the batch's decisions leave with it (counted when it commits, dropped
        # with the open batch's when it fails)
        _, tally = self.engine.close_batch()
        flight = _InFlight(pending, views, tally, t0, opened, marks=marks, sched=sched)
        waited = schedstat.process_wait_ms() if marks else 0.0
        # a step is at most half the revoke budget: a revoke waits for it and
        # then commits its own batch within the budget
        step_s = min(60.0, self.config.revoke_budget_ms / 2000)

        def finish() -> None:  # helper thread: the producer only
            transactions.retrying(
                lambda: producer.commit_transaction(self.timeout(step_s, in_flight=True)),
                self.metrics,
                left=lambda: self.left(in_flight=True),
            )
            flight.done_at = time.perf_counter()
            if marks:
                marks.append(("committed", time.monotonic()))
                sched.append(("commit_wait", schedstat.process_wait_ms() - waited))
            # the store's delivery reports
            producer.flush(self.timeout(min(10.0, step_s), in_flight=True))
            if marks:
                marks.append(("flushed", time.monotonic()))
                log_timeline(pending.events, marks, sched)

        flight.future = self.helper.submit(finish)
        self._inflight = flight

    def _committed(
        self, pending: Batch, views: list[ViewWrite], tally: Tally, seconds: float
    ) -> None:
        """The batch's transaction committed: apply and count it (loop thread)."""
        self.stuck_probe.txn_answered()
        self.ledger.apply_reports()
        self.store.committed(self.engine.partitions)
        if self.queries is not None:
            self.queries.committed(views)
        self.metrics.count_state(tally)
        self.metrics.count_decisions(tally)  # the committed batch's decisions
        self.failures.succeeded()
        self.fatal_budget.succeeded()  # stuck_budget: given back as stuck calls return
        self.metrics.commits.inc()
        self.metrics.batch_events.observe(pending.events)
        self.metrics.commit_seconds.observe(seconds)
        if not self.leaving:  # a revoke drops the partitions next: no eviction needed
            self._fresh = True

    def take_committed(self) -> bool:
        """Whether a batch committed since the last call.  The loop then settles
        the heap and evicts, out here: inside the commit's frames the committed
        batch is still referenced and the heap settle would walk and freeze it."""
        fresh, self._fresh = self._fresh, False
        return fresh

    def _failed(self, exc: KafkaException, opened: float, pending: Batch) -> None:
        assert self.producer is not None
        # the batch's decisions are refolded (or were never made): not counted
        self.engine.drop_decisions()
        self.metrics.count_state(self.engine.take_state_counts())
        # serve the delivery reports of failed records (poll re-raises a fatal
        # error, classified just below)
        with contextlib.suppress(KafkaException):
            self.producer.poll(0)
        self.ledger.apply_reports()  # a refused record names its topic (verdict)
        self.ledger.forget()
        eos = self.config.exactly_once
        now = time.monotonic()
        if now - opened >= self.config.effective_transaction_timeout_ms / 1000:
            self.overran_at = now
        verdict = transactions.verdict(exc, self.problems, self.config.group_id)
        self.metrics.txn_failures.labels(verdict.kind.value).inc()
        err = error_of(exc)
        if (
            verdict.kind is Kind.FATAL
            and eos
            and err is not None
            and self.replace_producer(
                err, now - opened, self.stuck_budget if isinstance(exc, StuckCall) else None
            )
        ):
            pass  # the new producer fenced the broken one; refold below
        elif verdict.kind in (Kind.FATAL, Kind.DENIED):
            line = verdict.line
            if verdict.kind is Kind.DENIED:  # the broker rarely says which ACL
                line = "; ".join(preflight.missing_or_fatal(self.config, self.problems)) or line
            raise self._fail(KafkaFatal(line)) from None
        else:
            log.warning("transaction failed (%s); aborting and rewinding", verdict.line)
        self.abort(pending.partitions())
        backoff = self.failures.failed(verdict.line)
        # after a group change the next poll serves the rebalance: no wait
        # (counted all the same: a change that never settles reaches the bound)
        if not self.leaving and verdict.code not in GROUP_CHANGED:
            self._stop.wait(backoff)

    def replace_producer(
        self, err: KafkaError, open_s: float, budget: ReplacementBudget | None = None
    ) -> bool:
        """Survive a fatal producer error that a broker fault caused.

        A coordinator moving during a commit can leave librdkafka's
        transactional producer fatally broken (INVALID_TXN_STATE, seen in the
        fault suite); a new producer with the same transactional id fences
        the old one and aborts its open transaction, and the batch is then
        refolded from the checkpoints.  A fence within the transaction
        timeout (``open_s``: how long the failed transaction was open) while
        every broker answers means another live member has our instance id:
        that ends the process (``FENCED``).  Shortly after a broker went away
        a coordinator fails over and may fence the transaction itself, and
        shortly after a transaction of ours outlived the timeout (the process
        was stopped: the coordinator aborted it and bumped the epoch) the
        next transaction is fenced at once (both seen in the fault suite):
        those are answered with a new producer.  Bounded
        (FatalBudget): a cause that persists — missing ACLs — still ends the
        process.
        """
        now = time.monotonic()
        if transactions.fenced_by_another_member(
            err,
            open_s,
            self.config,
            explained_at=(self.problems.broker_trouble_at, self.overran_at),
            replaced_at=self.replaced_at,
            instance_id=self.instance_id,
        ):
            return False
        if not (budget or self.fatal_budget).allow(err):
            return False
        log.error("producer fatal error (%s); replacing the producer", err)
        self.replaced_at = now
        self.clients.new_producer()
        self.init_pending = True
        # now if it can be (it fences the broken producer and aborts its open
        # transaction: the next owner of revoked partitions need not wait for
        # the coordinator's timeout), but never past a revoke's budget
        self._initialised()
        return True

    def _initialised(self) -> bool:
        """Finish a replaced producer's ``init_transactions``; while revoking,
        within what is left of the budget (False: not yet, retried before the
        next transaction; the rebalance does not wait for a coordinator)."""
        if not self.init_pending or not self.config.exactly_once:
            return True
        assert self.producer is not None
        left = self.left()
        done = transactions.init(
            self.producer,
            self.problems,
            self.txn_id,
            deadline_s=RETRY_DEADLINE_S if left is None else max(0.0, left),
            deferrable=left is not None,
        )
        if not done:
            log.warning(
                "the new producer's transactions were not initialised within the revoke "
                "budget; finishing that before the next transaction"
            )
        self.init_pending = not done
        if done:
            self.stuck_probe.txn_answered()
        return done

    def abort(self, partitions: set[int], *, rewind: bool = True) -> None:
        """Drop the open batch; restore touched partitions from the checkpoints."""
        if self._inflight is not None:
            kept = self.leaving
            if not rewind:  # lost partitions are not ours to rewind
                self.leaving = kept | partitions
            try:
                self.settle()
            finally:
                self.leaving = kept
        # a process stopping while no broker answers leaves the abort to the
        # coordinator (its timeout): the call would only wait (stopping.py)
        if STOPPING.is_set() and self.problems.brokers_down_at is not None:
            self.overran_at = time.monotonic()
        elif self.config.exactly_once and self.producer is not None and not self.init_pending:
            producer = self.producer
            # while revoking, within what is left of the budget (spent: one
            # short attempt; an abort that misses it is the coordinator's at
            # the transaction timeout, and the next owner restores)
            left = self.left()
            until = RETRY_DEADLINE_S if left is None else max(0.0, left)
            try:
                retry(
                    lambda: producer.abort_transaction(self.timeout(30)),
                    "abort_transaction",
                    deadline_s=until,
                )
            except KafkaException as exc:
                err = error_of(exc)
                if err is None or err.code() not in FENCED:
                    # the abort's end was not seen (timed out): the coordinator
                    # aborts the transaction at its timeout and bumps the epoch,
                    # so the fence our next transaction meets is the coordinator's,
                    # not another member's (replace_producer; a false "another
                    # member" verdict ended members under CPU starvation)
                    self.overran_at = time.monotonic()
                log.debug("abort_transaction: %s", exc)
        self.ledger.forget()
        self.metrics.aborts.inc()
        touched = self.engine.discard_batch() | partitions
        if not rewind or self.consumer is None:
            return
        numbers = sorted(touched & set(self.engine.partitions) - self.leaving)
        if numbers:  # all revoked (a shutdown): nothing of ours to rewind
            self._rewinder.rewind(numbers)
