"""Sending batches and settling their calls: the delivery rules of ``client``, carried out.

``Dispatcher`` is the machinery behind ``ToolClient.call_tools`` and ``verify``: it places
each call on a replica and its batcher, posts the batches, and settles every call from the
answer: a result, a re-send (after a backoff, under the same call_id), or an error saying
why. The rules (what may be re-sent where, ``outcome_unknown``, admission control after a
429) are explained in ``client``'s docstring.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from typing import Any

from protocol import Call, ErrorKind, ProtocolError
from trainer_client.client.batching import Batcher
from trainer_client.client.deadlines import Deadlines
from trainer_client.client.health import HealthMonitor
from trainer_client.client.idempotency import IdempotencyCatalog
from trainer_client.client.policies import BatchPolicy, RetryPolicy
from trainer_client.client.records import (
    CALLS,
    Endpoint,
    Metrics,
    Pending,
    Replica,
    error_message,
    is_overloaded,
    retry_after,
)
from trainer_client.client.routing import INSTANCE_HEADER, Router, SessionLost
from trainer_client.client.splits import Splitter
from trainer_client.client.transport import (
    Answer,
    AnswerTimeout,
    ConnectFailed,
    ConnectionBroken,
    Exchange,
    Transport,
)

__all__ = ["Dispatcher"]

log = logging.getLogger("trainer_client.client")  # one logger for the client's messages


class Dispatcher:
    """Places, posts and settles the batched calls of one ``ToolClient`` (one event loop)."""

    def __init__(
        self,
        transport: Transport,
        headers: dict[str, str],
        replicas: list[Replica],
        batch: BatchPolicy,
        retry: RetryPolicy,
        max_connections: int,
        router: Router,
        health: HealthMonitor,
        catalog: IdempotencyCatalog,
        metrics: Metrics,
    ) -> None:
        self._transport = transport
        self._headers = headers
        self._instance_headers: dict[str, dict[str, str]] = {}  # one dict per instance: encoded once
        self.replicas = replicas
        self.batch = batch
        self.retry = retry
        self._router = router
        self._health = health
        self._catalog = catalog
        self._metrics = metrics
        self._batchers: dict[str, dict[Replica, Batcher]] = {}  # endpoint name -> replica -> batcher
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pending = Deadlines(self._expire)  # submitted, not settled: by deadline; failed on aclose()
        self._backing_off: dict[Pending, tuple[asyncio.TimerHandle, Replica | None]] = {}
        self._splits = Splitter(batch, max_connections, self._join, metrics, self._background)
        self._closed = False

    async def aclose(self) -> None:
        """Stop: calls still pending end ``cancelled``."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for handle, _ in self._backing_off.values():
            handle.cancel()
        self._backing_off.clear()
        for item in self._pending.drain():
            self._finish(
                item, item.endpoint.failure(item.payload, ErrorKind.CANCELLED, "the client was closed")
            )
        batchers = [b for by_replica in self._batchers.values() for b in by_replica.values()]
        await asyncio.gather(*(b.aclose() for b in batchers), return_exceptions=True)

    # ----------------------------------------------------------------- submission

    async def run(
        self,
        endpoint: Endpoint,
        payloads: Sequence[Any],
        sessions: Sequence[str | None],
        timeout_s: float | None,
    ) -> list[Any]:
        """Submit the payloads and wait for every result (in order); never raises for a failed one."""
        if not payloads:
            return []
        loop = asyncio.get_running_loop()
        timeout = timeout_s if timeout_s is not None else self.retry.timeout_s
        now = time.monotonic()
        deadline = now + timeout
        items = [
            Pending(payload, endpoint, loop.create_future(), session, deadline, now)
            for payload, session in zip(payloads, sessions, strict=True)
        ]
        for item in items:
            self._pending.add(item)
            self._submit(item)
        try:
            await asyncio.gather(*(item.future for item in items))
        except asyncio.CancelledError:
            for item in items:
                self.abandon(item)
            raise
        return [item.future.result() for item in items]

    def submit_one(
        self, endpoint: Endpoint, payload: Any, session: str | None, timeout_s: float | None
    ) -> Pending:
        """``run`` for one payload, in two halves: the caller awaits ``future`` of what this
        returns, and calls ``abandon`` if it is cancelled (one coroutine less per call)."""
        now = time.monotonic()
        timeout = timeout_s if timeout_s is not None else self.retry.timeout_s
        item = Pending(
            payload, endpoint, asyncio.get_running_loop().create_future(), session, now + timeout, now
        )
        self._pending.add(item)
        if session is not None or self._closed:
            self._submit(item)
            return item
        # A new stateless call (most calls): ``_submit`` and ``_place`` less their other cases.
        replica = item.replica = self._router.least_loaded()
        replica.load += 1
        self._batcher(replica, endpoint).add(item)
        return item

    def abandon(self, item: Pending) -> None:
        """The caller gave up: its call stops counting as load, and is never settled."""
        item.future.cancel()
        self._unload(item)
        self._pending.discard(item)

    def _expire(self, item: Pending) -> None:
        """``Deadlines`` calls this for a call still pending at its deadline."""
        self._metrics.error("deadline")
        # Waiting for a re-send: say why (overloaded, unavailable); else it was out.
        kind, why = item.error or (ErrorKind.TIMEOUT, "no result")
        self._finish(
            item,
            item.endpoint.failure(
                item.payload,
                kind,
                f"{why} (client deadline of {item.deadline - item.started:g} s reached; "
                f"{item.attempts + item.overloaded} retries)",
            ),
        )

    def _submit(self, item: Pending, prefer: Replica | None = None) -> None:
        if item.future.done() or self._closed:
            return
        batcher = self._place(item, prefer)
        if batcher is not None:
            batcher.add(item)

    def _place(self, item: Pending, prefer: Replica | None) -> Batcher | None:
        """Route an item to a replica and count it there; returns the batcher it joins
        (None: its session was lost, and the item is settled with an error saying so)."""
        try:
            replica = self._router.route(item, prefer)
        except SessionLost as lost:
            self._fail_all([item], ErrorKind.UNKNOWN_SESSION, str(lost))
            return None
        item.replica = replica
        replica.load += 1
        return self._batcher(replica, item.endpoint)

    # ----------------------------------------------------------------- sending

    def _attempt_timeout(self, items: list[Pending]) -> float:
        remaining = max(item.deadline for item in items) - time.monotonic()
        if self.retry.request_timeout_s is not None:
            return max(0.001, min(self.retry.request_timeout_s, remaining + 1.0))
        return max(0.001, remaining + 1.0)  # +1 s: let the server's own timeout answer first

    async def _send_batch(self, replica: Replica, endpoint: Endpoint, items: list[Pending]) -> None:
        """Post one batch and settle every item; a bug fails the batch loudly, never silently."""
        try:
            await self._post_batch(replica, endpoint, items)
        except Exception as exc:
            self._crashed(items, f"sending a batch to {replica.url}", exc)

    async def _post_batch(self, replica: Replica, endpoint: Endpoint, items: list[Pending]) -> None:
        """Send one batch and settle every item: resolve, retry, or fail. Never raises."""
        if self._router.restarted(replica):  # calls placed before the restart was seen: fail the lost
            items = self._without_lost(items)
            if not items:
                return
        m = self._metrics
        replica.batches += 1
        if endpoint is CALLS:
            m.call_batches += 1
            m.calls_sent += len(items)
            m.max_batch = max(m.max_batch, len(items))
            replica.calls += len(items)
        else:
            m.verify_batches += 1
        if replica.described is None:  # once per replica (process): which tools are idempotent
            replica.described = asyncio.get_running_loop().create_task(self._catalog.learn(replica))
            self._background(replica.described)
        body, items = self._encode(endpoint, items)
        if body is None:
            return
        exchange = Exchange()
        number = replica.batches  # this batch's number among the replica's
        split = self._splits.arm(replica, number, items, exchange) if endpoint is CALLS else None
        failure: Exception | None = None
        expected = self._router.instance(replica)  # the process this batch's sessions live in
        try:
            response = await self._transport.post(
                replica.url + endpoint.path,
                body,
                self._headers_for(expected),
                self._attempt_timeout(items),
                exchange,
            )
        except Exception as exc:  # classified below: a failure must never leave callers hanging
            failure = exc
        finally:
            if split is not None:
                split.cancel()
        if failure is not None:
            await self._attempt_failed(replica, items, failure)
        else:
            await self._settle(replica, endpoint, items, response, expected, number)

    def _encode(self, endpoint: Endpoint, items: list[Pending]) -> tuple[bytes | None, list[Pending]]:
        """The batch's body, once; if a payload cannot be written as JSON, that call alone ends
        with an error saying so, and the body carries the others (None: no call is left)."""
        try:
            return endpoint.encode([item.payload for item in items]), items
        except TypeError:  # orjson.JSONEncodeError: a value JSON has no form for
            pass
        kept = []
        for item in items:
            try:
                endpoint.encode([item.payload])
            except TypeError as exc:
                self._metrics.error("unserialisable")
                self._fail_all([item], *_unserialisable(item.payload, exc))
            else:
                kept.append(item)
        return (endpoint.encode([item.payload for item in kept]) if kept else None), kept

    def _headers_for(self, instance: str | None) -> dict[str, str]:
        """The request headers, naming the process the sessions are expected in: another
        process at that address refuses them instead of starting them empty. One dict per
        instance, so that the transport encodes each once."""
        if instance is None:
            return self._headers
        headers = self._instance_headers.get(instance)
        if headers is None:
            if len(self._instance_headers) >= 64:  # replicas restart; keep the recent ones
                self._instance_headers.clear()
            headers = self._instance_headers[instance] = {**self._headers, INSTANCE_HEADER: instance}
        return headers

    def _without_lost(self, items: list[Pending]) -> list[Pending]:
        """The items whose session is not lost; the others end ``unknown_session`` now."""
        kept = []
        for item in items:
            why = self._router.lost(item.session) if item.session is not None else None
            if why is None:
                kept.append(item)
            else:
                self._fail_all([item], ErrorKind.UNKNOWN_SESSION, why)
        return kept

    async def _attempt_failed(self, replica: Replica, items: list[Pending], exc: Exception) -> None:
        """A POST got no answer: did its request (possibly) reach the server?"""
        m = self._metrics
        if isinstance(exc, ConnectFailed):
            m.error("connect")  # no connection, so no request: nothing ran
            self._health.mark_down(replica, f"connect failed: {exc}")
            refused = None if exc.timed_out else replica
            self._not_delivered(
                items, ErrorKind.UNAVAILABLE, f"cannot connect to {replica.url}: {exc}", refused
            )
        elif isinstance(exc, AnswerTimeout):
            m.error("request_timeout")  # the connection is intact: the server is up, still working
            self._health.schedule_probe(replica)
            message = f"{replica.url} did not answer in time"
            await self._maybe_delivered(replica, items, ErrorKind.TIMEOUT, message, process_up=True)
        elif isinstance(exc, ConnectionBroken):
            m.error("transport")  # the connection broke mid-call (a reset, a truncated answer)
            self._health.schedule_probe(replica)
            message = f"connection to {replica.url} broke with the calls in flight: {exc}"
            await self._maybe_delivered(replica, items, ErrorKind.UNAVAILABLE, message, process_up=False)
        else:  # a bug or an unexpected failure
            self._crashed(items, f"sending a batch to {replica.url}", exc)

    def _crashed(self, items: list[Pending], doing: str, exc: BaseException) -> None:
        """An unexpected exception: log its traceback, end the calls involved with an error."""
        self._metrics.error("client")
        log.error("unexpected error %s", doing, exc_info=exc)
        self._fail_all(items, ErrorKind.UNAVAILABLE, f"client error {doing}: {exc!r}")

    async def _join(self, replica: Replica, item: Pending) -> None:
        """One split POST (``splits``). A failure the batch POST will see too is left to
        it: that POST is still out and owns the retries. Anything else is a bug: the call ends
        with an error."""
        try:
            response = await self._transport.post(
                replica.url + CALLS.path,
                CALLS.encode([item.payload]),
                self._headers_for(self._router.instance(replica)),
                max(0.001, item.deadline - time.monotonic()) + 1.0,
            )
            if response.status_code != 200:
                return  # e.g. 429
            (result,) = CALLS.decode(response.content)
        except (ConnectFailed, AnswerTimeout, ConnectionBroken, ProtocolError, ValueError):
            return  # transport failures, unreadable answers
        except Exception as exc:
            self._crashed([item], f"joining a call on {replica.url}", exc)
            return
        if not is_overloaded(result):
            self._finish(item, result)

    async def _settle(
        self,
        replica: Replica,
        endpoint: Endpoint,
        items: list[Pending],
        response: Answer,
        sent: str | None,
        number: int,
    ) -> None:
        """Settle a batch's items from the answer; ``sent`` is the instance the request named,
        ``number`` the batch's among the replica's (for ``splits``)."""
        m = self._metrics
        status = response.status_code
        if status == 200:
            self._router.seen(replica, response.headers.get(INSTANCE_HEADER))  # before any session lands
            self._health.mark_up(replica)
            replica.answered(len(items))
            try:
                results = endpoint.decode(response.content)
            except Exception as exc:
                m.error("bad_response")
                self._fail_all(
                    items, ErrorKind.UNAVAILABLE, f"{replica.url} sent an unreadable answer: {exc}"
                )
                return
            if len(results) != len(items):
                m.error("bad_response")
                self._fail_all(
                    items,
                    ErrorKind.UNAVAILABLE,
                    f"{replica.url} returned {len(results)} results for {len(items)} requests",
                )
                return
            if endpoint is CALLS:
                self._splits.answered(replica, number, response.elapsed_s, results)
            for item, result in zip(items, results, strict=True):
                if result.error is None:  # the common case: done
                    if item.session is not None:
                        self._router.landed(item.session, replica)  # its state lives in this process now
                    self._finish(item, result)
                elif endpoint.overloaded(result):  # refused before it ran: re-send after a pause
                    m.error("overloaded")
                    item.overloaded += 1
                    delay = retry_after(response.headers.get("retry-after"), default=0.0)
                    self._retry(item, ErrorKind.OVERLOADED, result.error.message, delay=delay)
                elif (
                    item.session is not None
                    and result.error is not None
                    and result.error.kind == ErrorKind.UNKNOWN_SESSION
                    and self._router.fenced_new(item.session, sent, replica)
                ):  # a new session, refused only for naming the process before a restart
                    self._retry(item, ErrorKind.UNKNOWN_SESSION, result.error.message)
                else:
                    if item.session is not None:
                        self._router.landed(item.session, replica)  # its state lives in this process now
                    self._finish(item, result)
            return
        message = error_message(response)
        m.error(f"http_{status}")
        if status == 429 or (status == 503 and "retry-after" in response.headers):
            self._refused(replica, items, message, retry_after(response.headers.get("retry-after")))
        elif status >= 500:
            self._health.schedule_probe(replica)
            message = f"{replica.url} answered {status}: {message}"
            await self._maybe_delivered(replica, items, ErrorKind.UNAVAILABLE, message, process_up=False)
        elif status == 413 and len(items) > 1:  # too big as one batch: split it and try again
            half = len(items) // 2
            batcher = self._batcher(replica, endpoint)
            for part in (items[:half], items[half:]):
                batcher.launch(part)
        elif status in (401, 403):
            self._fail_all(items, ErrorKind.UNAUTHORIZED, f"{replica.url} refused the token: {message}")
        else:
            kind = ErrorKind.TOO_LARGE if status == 413 else ErrorKind.BAD_REQUEST
            self._fail_all(items, kind, f"{replica.url} rejected the batch ({status}): {message}")

    def _batcher(self, replica: Replica, endpoint: Endpoint) -> Batcher:
        by_replica = self._batchers.get(endpoint.name)
        if by_replica is None:
            by_replica = self._batchers[endpoint.name] = {}
        batcher = by_replica.get(replica)
        if batcher is None:
            batcher = by_replica[replica] = Batcher(replica, endpoint, self.batch, self._send_batch)
        return batcher

    def _background(self, task: asyncio.Task[Any]) -> None:
        """Keep a reference to a fire-and-forget task so it is not garbage collected."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----------------------------------------------------------------- admission control

    def _refused(self, replica: Replica, items: list[Pending], message: str, retry_after: float) -> None:
        """A 429 (or a 503 with Retry-After): the server took none of these calls.

        The replica is held back until Retry-After has passed (a backoff if it says 0),
        then admits a window (``Replica.refused``). The refused calls go back to the head
        of the line, on any replica.
        """
        pause = retry_after if retry_after > 0 else self.retry.backoff(replica.refusals + 1)
        replica.refused(len(items), pause)
        requeue: dict[Batcher, list[Pending]] = {}
        for item in items:
            self._unload(item)
            if item.future.done() or self._closed:
                continue
            item.overloaded += 1
            item.error = (ErrorKind.OVERLOADED, message)
            self._metrics.retries += 1
            batcher = self._place(item, None)
            if batcher is not None:
                requeue.setdefault(batcher, []).append(item)
        for batcher, group in requeue.items():
            batcher.add_front(group)

    # ----------------------------------------------------------------- settling

    def _unload(self, item: Pending) -> None:
        if item.replica is not None:
            item.replica.load -= 1
            item.replica = None

    def _finish(self, item: Pending, value: Any) -> None:
        self._unload(item)
        self._pending.discard(item)
        if item.future.done():
            return
        item.future.set_result(value)
        self._metrics.latencies_ms.append((time.monotonic() - item.started) * 1000.0)
        if value.is_error and value.error is not None:
            kind = value.error.kind.value
            self._metrics.result_errors[kind] = self._metrics.result_errors.get(kind, 0) + 1

    def _fail_all(self, items: list[Pending], kind: ErrorKind, message: str) -> None:
        for item in items:
            self._finish(item, item.endpoint.failure(item.payload, kind, message))

    def _outcome_unknown(self, item: Pending, message: str) -> None:
        self._finish(
            item,
            item.endpoint.failure(
                item.payload,
                ErrorKind.OUTCOME_UNKNOWN,
                f"{message}; the call may or may not have run, and its tool is not known to be "
                "idempotent, so it is not run again",
            ),
        )

    def _not_delivered(
        self, items: list[Pending], kind: ErrorKind, message: str, refused: Replica | None = None
    ) -> None:
        """No request reached a server: re-send anywhere, unless a call may run where it was
        or its session's state was on the replica that ``refused`` the connection."""
        for item in items:
            if item.pinned is not None:  # its replica went away while the call may have run there
                self._outcome_unknown(item, message)
            elif (
                refused is not None
                and item.session is not None
                and (lost := self._router.refused(item.session, refused))
            ):
                self._fail_all([item], ErrorKind.UNKNOWN_SESSION, lost)
            else:
                self._retry(item, kind, message)

    async def _maybe_delivered(
        self, replica: Replica, items: list[Pending], kind: ErrorKind, message: str, *, process_up: bool
    ) -> None:
        """The request may have reached the server but no answer came: the calls may have run.

        Idempotent tools are re-sent (to the same replica first: its store may hold the
        result). Any other call may only go back to the same replica process: if that is
        known to be up (a timeout on an intact connection), it joins the running call
        there; if the connection broke, the process may be gone with its record of what
        ran, so the call ends ``outcome_unknown`` rather than risk running twice.
        """
        await self._catalog.settle(items, self.replicas)
        for item in items:
            if self._catalog.is_idempotent(item):
                self._retry(item, kind, message, prefer=replica)
            elif process_up:
                item.pinned = replica
                self._retry(item, kind, message)
            else:
                self._outcome_unknown(item, message)

    def _retry(
        self,
        item: Pending,
        kind: ErrorKind,
        message: str,
        *,
        prefer: Replica | None = None,
        delay: float = 0.0,
    ) -> None:
        """Send the same payload (same call_id) again after a backoff, within its deadline."""
        self._unload(item)
        if item.future.done():
            return
        item.error = (kind, message)
        if kind != ErrorKind.OVERLOADED:
            item.attempts += 1
            if self.retry.max_retries is not None and item.attempts > self.retry.max_retries:
                self._give_up(item, f"gave up after {item.attempts} tries")
                return
        if item.pinned is not None:
            wait = self.retry.backoff_s * random.uniform(0.5, 1.0)  # its replica is up: join the call soon
        else:
            wait = max(delay, self.retry.backoff(item.attempts + item.overloaded))
        if time.monotonic() + wait >= item.deadline:
            self._give_up(item, "deadline reached")
            return
        self._metrics.retries += 1
        handle = asyncio.get_running_loop().call_later(wait, self._resend, item, prefer)
        self._backing_off[item] = (handle, prefer)

    def _resend(self, item: Pending, prefer: Replica | None) -> None:
        self._backing_off.pop(item, None)
        self._submit(item, prefer)

    def wake(self) -> None:
        """A replica came back: calls waiting out a connection failure go now."""
        for item, (handle, prefer) in list(self._backing_off.items()):
            if item.error is not None and item.error[0] == ErrorKind.UNAVAILABLE:
                handle.cancel()
                self._resend(item, prefer)

    def _give_up(self, item: Pending, why: str) -> None:
        kind, message = item.error or (ErrorKind.TIMEOUT, "no result")
        self._finish(item, item.endpoint.failure(item.payload, kind, f"{message} ({why})"))


def _unserialisable(payload: Any, exc: Exception) -> tuple[ErrorKind, str]:
    """Why a call (or verify request) that orjson cannot write was not sent, and what to do."""
    advice = (
        "send only JSON values: strings, booleans, None, integers within 64 bits, floats, "
        "lists, and dicts with string keys"
    )
    if isinstance(payload, Call):
        return ErrorKind.INVALID_ARGUMENTS, (
            f"call {payload.call_id} to {payload.name!r} was not sent: its arguments cannot be "
            f"written as JSON ({exc}); {advice}"
        )
    return (
        ErrorKind.BAD_REQUEST,
        f"the verify request was not sent: it cannot be written as JSON ({exc}); {advice}",
    )
