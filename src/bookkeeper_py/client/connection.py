"""A client connection to one bookie.

Adds and reads go over v2 by default (BookKeeper's fast path; responses matched by operation,
ledger and entry, in order per key) or over v3 (matched by txnId). Every request has a deadline;
a periodic check fails the overdue ones with ``TimeoutError``. When the connection drops, every
pending request fails with ``BookieHandleNotAvailableError``.

A v2 request pending is its callback and its deadline, no object of its own, in a table of
(operation, ledger) whose rows are dicts keyed by entry id: an answer or a request costs an int's
hash and one lookup, not a tuple made and hashed (a run of answers of one ledger looks its row up
once). The clock is read once for the requests of one loop pass (they leave in one write and
share a deadline), not once per request, and the answers of one ``data_received`` are parsed
and completed in one loop over their frames.

A ledger writer sends the adds of one loop pass to a bookie as one batch (``add_batch``): one
``AddSink`` stands for all of them, and the acks of one ``data_received`` reach it in one call.

Given ``ChannelStats`` (the client's per-bookie metrics, off by default), a connection times
each request from the loop pass that wrote it to its answer, timeout or loss. A v2 request keeps
no send time of its own: its deadline, the pass's one clock read plus the request timeout, tells
it. Without them the answers cost one attribute check per ``data_received``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, cast

from bookkeeper_py import errors
from bookkeeper_py.auth import MAX_AUTH_ROUNDS, AuthenticationError, ClientAuthProvider
from bookkeeper_py.client.clock import Clock, MonotonicClock
from bookkeeper_py.speedups import native
from bookkeeper_py.tls import TlsConfig, TlsError, TlsSession
from bookkeeper_py.wire import v2, v3
from bookkeeper_py.wire.errors import MalformedMessageError
from bookkeeper_py.wire.framing import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, FrameError
from bookkeeper_py.wire.output import OutputBuffer
from bookkeeper_py.wire.proto import bookkeeper_protocol_pb2 as pb
from bookkeeper_py.wire.status import StatusCode, from_v2

if TYPE_CHECKING:
    from bookkeeper_py.client.client_metrics import ChannelStats
    from bookkeeper_py.metrics import OpStats

log = logging.getLogger(__name__)

# v2 opcodes of the pending-request keys as plain ints: an IntEnum member costs a lookup per
# request and hashes slower.
_ADD_ENTRY = int(v2.OpCode.ADD_ENTRY)
_READ_ENTRY = int(v2.OpCode.READ_ENTRY)
_RESPONSE_HEAD = v2.RESPONSE_HEAD
# The C speedups' pass over a run of add acks and read answers, where they are in use.
_take_answers = native.v2_take_answers if native is not None else None
# Theirs for a batch of plain reads: registered and framed in one call.
_register_reads = native.v2_register_reads if native is not None else None
# And for a batch of adds: registered, one dict operation an entry.
_register = native.v2_register if native is not None else None

# Called with (status, body) on an answer, or (None, error) when the request failed locally.
Callback = Callable[[StatusCode | None, bytes | errors.BKError], None]


class BatchSink:
    """Where the answers to a batch of v2 requests of one kind go: one object for the whole
    batch, called once per ``data_received`` with what it brought, not once per answer."""

    __slots__ = ()

    def failed(self, entry_ids: list[int], error: errors.BKError) -> None:
        """No answer will come for these requests: the connection was lost, or they timed out."""
        raise NotImplementedError


class AddSink(BatchSink):
    """The answers to a batch of adds (``BookieConnection.add_batch``)."""

    __slots__ = ()

    def acked(self, entry_ids: list[int]) -> None:
        """The bookie made these entries durable (EOK), in the order it answered."""
        raise NotImplementedError

    def refused(self, entry_id: int, status: StatusCode) -> None:
        """The bookie answered this add with an error ``status``."""
        raise NotImplementedError


class ReadSink(BatchSink):
    """The answers to a batch of entry reads (``BookieConnection.read_batch``)."""

    __slots__ = ()

    def answered(self, frames: list[bytes]) -> None:
        """The answer frames (a v2 response: its 24-byte fixed part, then the body), in the
        order the bookie sent them; ``v2.read_answer`` reads one. Whole frames, not bodies cut
        out of them: a body is copied once, into the entry read, and only if it is kept."""
        raise NotImplementedError


# A pending v2 request: its callback (or the sink of its batch) and deadline.
_V2Request = tuple[Callback | BatchSink, float]
_V2Key = tuple[int, int, int]  # (operation, ledger, entry)
# The requests of one (operation, ledger) pending, by entry id.
_V2Row = dict[int, _V2Request]
# A long poll's: (status, body, the bookie's LAC) or (None, error, -1).
LongPollCallback = Callable[[StatusCode | None, bytes | errors.BKError, int], None]
ReadLacCallback = Callable[[StatusCode | None, bytes, bytes | errors.BKError], None]
# GET_BOOKIE_INFO's answer: (status, total disk capacity, free disk space) in bytes, or (None,
# 0, 0) with the error instead of the status.
DiskInfoCallback = Callable[[StatusCode | None, int, int, errors.BKError | None], None]


class _Pending:
    __slots__ = (
        "callback",
        "deadline",
        "disk",
        "done",
        "key",
        "lac_body",
        "max_lac",
        "operation",
        "sent",
    )
    # Set only on a connection with per-channel stats: the v3 operation type and when it was
    # sent (the clock's seconds).
    operation: int
    sent: float

    def __init__(
        self, key: tuple[int, int, int] | int, callback: Callback, deadline: float
    ) -> None:
        self.key = key
        self.callback = callback
        self.deadline = deadline
        self.done = False
        self.max_lac = -1  # a v3 read answer's maxLAC
        self.lac_body = b""  # a READ_LAC answer's explicit LAC (its body is the last entry)
        self.disk = (0, 0)  # a GET_BOOKIE_INFO answer's (total disk capacity, free space)


# Per-channel stats of a request kind: its answers, its timeouts.
_Timers = tuple["OpStats", "OpStats"]


def _request_timers(stats: ChannelStats, use_v3: bool) -> dict[int, _Timers]:
    """The per-channel stats of each request kind of a connection: by v2 opcode, or by v3
    operation type."""
    if not use_v3:
        return {
            _ADD_ENTRY: stats.add,
            _READ_ENTRY: stats.read,
            int(v2.OpCode.BATCH_READ_ENTRY): stats.read,
        }
    return {
        pb.ADD_ENTRY: stats.add,
        pb.READ_ENTRY: stats.read,  # long polls too, their wait included (as Java's)
        pb.WRITE_LAC: stats.write_lac,
        pb.READ_LAC: stats.read_lac,
        pb.FORCE_LEDGER: stats.force,
        pb.GET_BOOKIE_INFO: stats.bookie_info,
    }


class BookieConnection(asyncio.Protocol):
    """One TCP connection to a bookie, speaking v2 (default) or v3."""

    def __init__(
        self,
        bookie_id: str,
        use_v3: bool,
        request_timeout_s: float,
        clock: Clock | None = None,
        stats: ChannelStats | None = None,
    ) -> None:
        self.bookie_id = bookie_id
        self._clock = clock or MonotonicClock()
        self._tls: TlsSession | None = None
        # While connecting: the TLS handshake, then the START_TLS / AUTH answers, one at a time.
        self._handshake: asyncio.Future[None] | None = None
        self._setup_answer: asyncio.Future[bytes] | None = None
        self.use_v3 = use_v3
        self.request_timeout_s = request_timeout_s
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder(DEFAULT_MAX_FRAME_SIZE)
        # (operation, ledger) -> entry -> the oldest request of that key; the others (nearly
        # never any: the same entry read twice at once) wait in _v2_more, in the order sent.
        # A row left empty stays until the next timeout check (rows come and go with ledgers).
        self._v2_pending: dict[tuple[int, int], _V2Row] = {}
        self._v2_more: dict[_V2Key, deque[_V2Request]] = {}
        self._pass_deadline: float | None = None  # of the requests written this loop pass
        self._v3_pending: dict[int, _Pending] = {}
        self._txn_ids = itertools.count(1)
        self._closed_error: errors.BKError | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._output: OutputBuffer | None = None  # frames of this loop pass, written together
        # The per-channel stats by request kind; None: not recorded (the default)
        self._timers = _request_timers(stats, use_v3) if stats is not None else None

    @classmethod
    async def connect(
        cls,
        bookie_id: str,
        host: str,
        port: int,
        *,
        use_v3: bool,
        connect_timeout_s: float,
        request_timeout_s: float,
        tls: TlsConfig | None = None,
        auth: ClientAuthProvider | None = None,
        tls_context: ssl.SSLContext | None = None,
        clock: Clock | None = None,
        stats: ChannelStats | None = None,
    ) -> BookieConnection:
        """A connection ready for requests: connected, then upgraded to TLS and authenticated
        when ``tls`` / ``auth`` are given, all within ``connect_timeout_s``. ``tls_context`` is
        ``tls.client_context()`` made once by the caller (it reads the trust files). With
        ``stats``, its requests are timed there."""
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(
                    lambda: cls(bookie_id, use_v3, request_timeout_s, clock, stats), host, port
                ),
                connect_timeout_s,
            )
        except (TimeoutError, OSError) as error:
            raise errors.BookieHandleNotAvailableError(
                f"cannot connect to bookie {bookie_id} at {host}:{port}: {error or 'timed out'}"
            ) from error
        if tls is None and auth is None:
            return protocol
        try:
            if tls is not None and tls_context is None:
                tls_context = tls.client_context()
            await asyncio.wait_for(
                protocol._secure(host, tls, tls_context, auth), connect_timeout_s
            )
        except TimeoutError as error:
            protocol.close()
            raise errors.BookieHandleNotAvailableError(
                f"bookie {bookie_id} did not complete TLS / authentication within "
                f"{connect_timeout_s:g} s"
            ) from error
        except BaseException:
            protocol.close()
            raise
        return protocol

    # -- connection set-up: START_TLS, the TLS handshake, AUTH ---------------------------------

    async def _secure(
        self,
        host: str,
        tls: TlsConfig | None,
        context: ssl.SSLContext | None,
        auth: ClientAuthProvider | None,
    ) -> None:
        if tls is not None:
            assert context is not None
            if tls.start_tls:
                request = self._v3_request(pb.START_TLS)
                request.startTLSRequest.SetInParent()
                answer = v3.decode_response(await self._setup_exchange(v3.encode(request)))
                if answer.status != pb.EOK:
                    raise TlsError(
                        f"bookie {self.bookie_id} refused START_TLS "
                        f"({StatusCode(answer.status).name}): it has no TLS configured"
                    )
            assert self._transport is not None and self._loop is not None
            assert self._output is not None
            self._output.flush()  # nothing may be wrapped that was sent before TLS
            self._tls = TlsSession(context, server_side=False, server_hostname=host)
            self._handshake = self._loop.create_future()
            self._tls.start()
            self._transport.write(self._tls.take_outgoing())
            await self._handshake
        if auth is not None:
            await self._authenticate(auth)

    async def _setup_exchange(self, data: bytes) -> bytes:
        """Sends one set-up message and waits for the bookie's answer frame."""
        if self._transport is None:
            raise self._closed_error or errors.BookieHandleNotAvailableError(
                f"connection to bookie {self.bookie_id} closed while connecting"
            )
        assert self._loop is not None
        self._setup_answer = self._loop.create_future()
        self._write(data)
        try:
            return await self._setup_answer
        finally:
            self._setup_answer = None

    async def _authenticate(self, provider: ClientAuthProvider) -> None:
        session = provider.new_session()
        payload: bytes | None = session.initial()
        for _ in range(MAX_AUTH_ROUNDS):
            assert payload is not None
            try:
                reply = await self._auth_exchange(provider.plugin_name, payload)
            except errors.BookieHandleNotAvailableError as error:
                raise AuthenticationError(
                    f"bookie {self.bookie_id} closed the connection during authentication: it "
                    f"refused the credentials or runs another plugin than {provider.plugin_name!r}"
                ) from error
            payload = session.process(reply)
            if payload is None:
                return
        raise AuthenticationError(
            f"bookie {self.bookie_id}: authentication not done after {MAX_AUTH_ROUNDS} exchanges"
        )

    async def _auth_exchange(self, plugin_name: str, payload: bytes) -> bytes:
        if not self.use_v3:
            answer = v2.decode_auth(
                await self._setup_exchange(v2.encode_auth(plugin_name, payload))
            )
            return answer.payload
        request = self._v3_request(pb.AUTH)
        request.authRequest.authPluginName = plugin_name
        request.authRequest.payload = payload
        response = v3.decode_response(await self._setup_exchange(v3.encode(request)))
        if response.status != pb.EOK or not response.HasField("authResponse"):
            raise AuthenticationError(
                f"bookie {self.bookie_id} refused authentication "
                f"({StatusCode(response.status).name}): wrong credentials, or it runs another "
                f"plugin than {plugin_name!r}"
            )
        return response.authResponse.payload

    def _v3_request(self, operation: int, priority: int = 0) -> pb.Request:
        """A v3 request with its header (the next txnId)."""
        request = pb.Request()
        request.header.CopyFrom(v3.header(operation, next(self._txn_ids), priority))
        return request

    def _write(self, data: bytes) -> None:
        assert self._transport is not None and self._output is not None
        self._output.write(data)

    def _send_now(self, data: bytes) -> None:
        self._pass_deadline = None  # the next request starts a new batch: read the clock
        if self._transport is not None:
            self._transport.write(data if self._tls is None else self._tls.wrap(data))

    @property
    def is_open(self) -> bool:
        return self._transport is not None and self._closed_error is None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()
        self._output = OutputBuffer(self._loop, self._send_now)
        self._schedule_timeout_check()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(
            errors.BookieHandleNotAvailableError(
                f"connection to bookie {self.bookie_id} closed" + (f": {exc}" if exc else "")
            )
        )

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self._fail_all(
            errors.ClientClosedError(
                f"connection to bookie {self.bookie_id} was closed by the client"
            )
        )

    def _fail_all(self, error: errors.BKError) -> None:
        if self._closed_error is None:
            self._closed_error = error
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for waiter in (self._handshake, self._setup_answer):
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)
        if self._timers is not None:
            self._time_losses()
        v2_pending = [(key, target) for key, (target, _) in self._v2_requests()]
        pending = [*self._v3_pending.values()]
        self._v2_pending.clear()
        self._v2_more.clear()
        self._v3_pending.clear()
        self._fail_v2(v2_pending, error)
        for request in pending:
            self._finish(request, None, error)

    def _v2_requests(self) -> list[tuple[_V2Key, _V2Request]]:
        """Every v2 request pending, each with its key (the oldest of a key first)."""
        requests = [
            ((operation, ledger_id, entry_id), request)
            for (operation, ledger_id), row in self._v2_pending.items()
            for entry_id, request in row.items()
        ]
        for key, queue in self._v2_more.items():
            requests.extend((key, request) for request in queue)
        return requests

    def _v2_row(self, operation: int, ledger_id: int) -> _V2Row:
        """The pending requests of ``operation`` on ``ledger_id`` (made empty if none)."""
        row = self._v2_pending.get((operation, ledger_id))
        if row is None:
            row = self._v2_pending[operation, ledger_id] = {}
        return row

    @classmethod
    def _fail_v2(
        cls, requests: list[tuple[_V2Key, Callback | BatchSink]], error: errors.BKError
    ) -> None:
        """Fails v2 requests with ``error``: each callback on its own, the requests of a batch
        in one call to its sink."""
        batches: dict[BatchSink, list[int]] = {}
        for key, target in requests:
            if isinstance(target, BatchSink):
                batches.setdefault(target, []).append(key[2])
            else:
                cls._complete(target, None, error)
        for sink, entry_ids in batches.items():
            try:
                sink.failed(entry_ids, error)
            except Exception:  # a sink bug must not take the connection down
                log.exception("failing a batch of requests failed")

    @classmethod
    def _finish(
        cls, request: _Pending, status: StatusCode | None, body: bytes | errors.BKError
    ) -> None:
        if request.done:
            return
        request.done = True
        cls._complete(request.callback, status, body)

    @staticmethod
    def _complete(
        callback: Callback, status: StatusCode | None, body: bytes | errors.BKError
    ) -> None:
        try:
            callback(status, body)
        except Exception:  # a callback bug must not take the connection down
            log.exception("callback for a bookie response failed")

    # -- per-channel stats ---------------------------------------------------------------------

    def _time_v2_answers(self, frames: list[bytes]) -> None:
        """Records the requests ``frames`` answer, before they are taken out: each was sent
        ``request_timeout_s`` before its deadline, so the successes of one loop pass's requests
        took the same time and are recorded at once. (Two answers of one key in one batch, the
        same entry read twice at once, both take the older request's time.)"""
        timers, pending = self._timers, self._v2_pending
        assert timers is not None
        succeeded: dict[tuple[int, float], int] = {}  # (opcode, deadline) -> answers
        unpack = _RESPONSE_HEAD.unpack_from
        sent_offset = self._clock.now() + self.request_timeout_s  # now - (deadline - timeout)
        for frame in frames:
            if len(frame) < v2.RESPONSE_FIXED_SIZE:
                break  # malformed: the pass over the answers drops the connection
            version, opcode, flags, rc, ledger_id, entry_id = unpack(frame)
            if version == 0:
                opcode = flags & 0xFF
            row = pending.get((opcode, ledger_id))
            request = row.get(entry_id) if row is not None else None
            if request is None or opcode not in timers:
                continue  # nobody waits (timed out, recorded then), or not timed
            if rc == 0:
                key = (opcode, request[1])
                succeeded[key] = succeeded.get(key, 0) + 1
            else:
                timers[opcode][0].failure(sent_offset - request[1])
        for (opcode, deadline), count in succeeded.items():
            timers[opcode][0].successes(sent_offset - deadline, count)

    def _time_v3_answer(self, request: _Pending, status: StatusCode) -> None:
        assert self._timers is not None
        kind = self._timers.get(request.operation)
        if kind is not None:
            elapsed = self._clock.now() - request.sent
            if status == StatusCode.EOK:
                kind[0].success(elapsed)
            else:
                kind[0].failure(elapsed)

    def _time_out(self, kind: _Timers | None, elapsed: float) -> None:
        """A request that timed out after ``elapsed`` seconds: a failure, and a timeout."""
        if kind is not None:
            kind[0].failure(elapsed)
            kind[1].success(elapsed)

    def _time_losses(self) -> None:
        """Records the requests pending as the connection is lost (or closed) as failures."""
        timers = self._timers
        assert timers is not None
        now = self._clock.now()
        sent_offset = now + self.request_timeout_s
        for key, (_, deadline) in self._v2_requests():
            kind = timers.get(key[0])
            if kind is not None:
                kind[0].failure(sent_offset - deadline)
        for pending in self._v3_pending.values():
            kind = timers.get(pending.operation)
            if kind is not None:
                kind[0].failure(now - pending.sent)

    # -- timeouts ------------------------------------------------------------------------------

    def _schedule_timeout_check(self) -> None:
        assert self._loop is not None
        period = max(min(self.request_timeout_s / 2, 1.0), 0.05)
        self._timer = self._loop.call_later(period, self._check_timeouts)

    def _check_timeouts(self) -> None:
        now = self._clock.now()
        expired_v2 = self._expire_v2(now)
        expired = [p for p in self._v3_pending.values() if p.deadline <= now]
        for request in expired:
            self._v3_pending.pop(cast(int, request.key), None)
            if self._timers is not None:
                self._time_out(self._timers.get(request.operation), now - request.sent)
        if expired_v2 or expired:
            error = errors.TimeoutError(
                f"bookie {self.bookie_id} did not answer within {self.request_timeout_s:g} s"
            )
            self._fail_v2(expired_v2, error)
            for request in expired:
                self._finish(request, None, error)
        if self._transport is not None:
            self._schedule_timeout_check()

    def _expire_v2(self, now: float) -> list[tuple[_V2Key, Callback | BatchSink]]:
        """Takes the v2 requests past their deadline out, older first per key; drops the rows
        left empty."""
        pending = self._v2_pending
        expired: list[tuple[_V2Key, Callback | BatchSink]] = []
        timers = self._timers
        for (operation, ledger_id), row in list(pending.items()):
            for entry_id in [entry for entry, (_, deadline) in row.items() if deadline <= now]:
                while (oldest := row.get(entry_id)) is not None and oldest[1] <= now:
                    key = (operation, ledger_id, entry_id)
                    self._take_v2(row, key)
                    expired.append((key, oldest[0]))
                    if timers is not None:
                        elapsed = now - (oldest[1] - self.request_timeout_s)
                        self._time_out(timers.get(operation), elapsed)
            if not row:
                del pending[operation, ledger_id]
        return expired

    def _take_v2(self, row: _V2Row | None, key: _V2Key) -> _V2Request | None:
        """Takes the oldest pending request of ``key`` out of its ``row`` (the next of that
        key, if any, becomes the oldest); None if none is pending."""
        if row is None:
            return None
        request = row.pop(key[2], None)
        if request is not None and self._v2_more:
            queue = self._v2_more.get(key)
            if queue:
                row[key[2]] = queue.popleft()
                if not queue:
                    del self._v2_more[key]
        return request

    # -- requests ------------------------------------------------------------------------------

    def _not_connected(self) -> errors.BKError:
        return self._closed_error or errors.BookieHandleNotAvailableError(
            f"bookie {self.bookie_id}: not connected"
        )

    def _deadline(self) -> float:
        """The deadline of the requests written in this loop pass (one clock read per pass)."""
        deadline = self._pass_deadline
        if deadline is None:
            deadline = self._pass_deadline = self._clock.now() + self.request_timeout_s
        return deadline

    def _queue_v2(self, key: _V2Key, request: _V2Request) -> None:
        """A second request of a pending key (the same entry read twice at once) waits behind
        the first: answers of one key come in the order sent."""
        queue = self._v2_more.get(key)
        if queue is None:
            queue = self._v2_more[key] = deque()
        queue.append(request)

    def _register_v2(self, key: _V2Key, callback: Callback) -> bool:
        if self._transport is None:
            callback(None, self._not_connected())
            return False
        self._put_v2(self._v2_row(key[0], key[1]), key, (callback, self._deadline()))
        return True

    def _put_v2(self, row: _V2Row, key: _V2Key, request: _V2Request) -> None:
        """``request`` into ``row`` under the entry of ``key``, or behind the pending one."""
        if key[2] in row:
            self._queue_v2(key, request)
        else:
            row[key[2]] = request

    def _send_v3(
        self, request: pb.Request, callback: Callback, extra_wait_s: float = 0.0
    ) -> _Pending | None:
        if self._transport is None:
            callback(
                None,
                self._closed_error
                or errors.BookieHandleNotAvailableError(f"bookie {self.bookie_id}: not connected"),
            )
            return None
        txn_id = request.header.txnId
        now = self._clock.now()
        pending = _Pending(txn_id, callback, now + self.request_timeout_s + extra_wait_s)
        if self._timers is not None:
            pending.operation, pending.sent = request.header.operation, now
        self._v3_pending[txn_id] = pending
        self._write(v3.encode(request))
        return pending

    def add(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        entry: bytes,
        recovery: bool,
        callback: Callback,
        deferred_sync: bool = False,
        frame: bytes | None = None,
        high_priority: bool = True,
    ) -> None:
        """Sends an add; ``callback(status, b"")`` on the answer. ``deferred_sync`` (v3 write
        flag DEFERRED_SYNC): the bookie answers before its journal sync; v2 cannot carry it
        and answers EBADVERSION, as BookKeeper refuses the combination. ``frame``: the v2
        request already encoded (a writer encodes an entry once for its whole write set).
        A ``recovery`` add is high priority (a ledger's recovery, which its readers and next
        writer wait for) unless ``high_priority`` is false: a re-replication copy, background
        work, as BookKeeper's replicator sends it (RECOVERY_ADD without HIGH_PRIORITY)."""
        if deferred_sync and not self.use_v3:
            callback(StatusCode.EBADVERSION, b"")
            return
        if self.use_v3:
            request = self._v3_request(pb.ADD_ENTRY, 1 if recovery and high_priority else 0)
            add = request.addRequest
            add.ledgerId, add.entryId, add.masterKey, add.body = (
                ledger_id,
                entry_id,
                master_key,
                entry,
            )
            if recovery:
                add.flag = pb.AddRequest.RECOVERY_ADD
            if deferred_sync:
                add.writeFlags = v3.WRITE_FLAG_DEFERRED_SYNC
            self._send_v3(request, callback)
            return
        if self._register_v2((_ADD_ENTRY, ledger_id, entry_id), callback):
            assert self._transport is not None
            if frame is None:
                flags = v2.FLAG_NONE
                if recovery:
                    flags = v2.FLAG_RECOVERY_ADD
                    if high_priority:
                        flags |= v2.FLAG_HIGH_PRIORITY
                frame = v2.encode_add_request(master_key, entry, flags)
            self._write(frame)

    def add_batch(
        self, ledger_id: int, entry_ids: list[int], chunks: list[bytes], sink: AddSink
    ) -> None:
        """Sends v2 adds of ``ledger_id`` at once: ``chunks`` are their encoded requests
        (pieces of frames, joined into one write with whatever this pass wrote before them),
        ``entry_ids`` the entries they add; the answers go to ``sink``. v2 only."""
        if self._register_batch(_ADD_ENTRY, ledger_id, entry_ids, sink):
            assert self._output is not None
            self._output.send(chunks)

    def read_batch(self, ledger_id: int, entry_ids: list[int], sink: ReadSink) -> None:
        """Reads entries of ``ledger_id`` (plain v2 reads, no fencing), written with the other
        requests of this loop pass; the answers go to ``sink``. v2 only."""
        if _register_reads is None or self.use_v3 or self._transport is None:
            if self._register_batch(_READ_ENTRY, ledger_id, entry_ids, sink):
                self._write(v2.encode_read_requests(ledger_id, entry_ids))
            return
        request = (sink, self._deadline())
        frames, taken = _register_reads(
            self._v2_row(_READ_ENTRY, ledger_id),
            ledger_id,
            entry_ids,
            request,
            v2.PLAIN_READ_HEADER,
        )
        for entry_id in taken:  # the same entry read twice at once: behind the first
            self._queue_v2((_READ_ENTRY, ledger_id, entry_id), request)
        self._write(frames)

    def _register_batch(
        self, operation: int, ledger_id: int, entry_ids: list[int], sink: BatchSink
    ) -> bool:
        """Registers a batch of v2 requests, one deadline for all, answered to ``sink``; False
        (and the sink told) when the connection is closed."""
        if self.use_v3:
            raise ValueError(
                f"batched requests are v2 requests; the connection to {self.bookie_id} speaks v3"
            )
        if self._transport is None:
            sink.failed(entry_ids, self._not_connected())
            return False
        request = (sink, self._deadline())
        row = self._v2_row(operation, ledger_id)
        if _register is not None:  # one dict operation an entry, in C
            for entry_id in _register(row, entry_ids, request):
                self._queue_v2((operation, ledger_id, entry_id), request)
            return True
        fresh = dict.fromkeys(entry_ids, request)
        if len(fresh) == len(entry_ids) and row.keys().isdisjoint(fresh):
            row.update(fresh)  # nearly always: no key taken, and in C
            return True
        for entry_id in entry_ids:
            self._put_v2(row, (operation, ledger_id, entry_id), request)
        return True

    def read(
        self,
        ledger_id: int,
        entry_id: int,
        fence: bool,
        master_key: bytes | None,
        callback: Callback,
    ) -> None:
        """Sends a read (a fencing read when ``fence``); ``callback(status, entry bytes)``."""
        if self.use_v3:
            request = self._v3_request(pb.READ_ENTRY, 1 if fence else 0)
            read = request.readRequest
            read.ledgerId, read.entryId = ledger_id, entry_id
            if fence:
                read.flag = pb.ReadRequest.FENCE_LEDGER
                read.masterKey = master_key or b""
            self._send_v3(request, callback)
            return
        if self._register_v2((_READ_ENTRY, ledger_id, entry_id), callback):
            assert self._transport is not None
            flags = v2.FLAG_DO_FENCING | v2.FLAG_HIGH_PRIORITY if fence else v2.FLAG_NONE
            self._write(
                v2.encode_read_request(ledger_id, entry_id, flags, master_key if fence else None)
            )

    def batch_read(
        self,
        ledger_id: int,
        start_entry_id: int,
        max_count: int,
        max_size: int,
        callback: Callback,
    ) -> None:
        """BATCH_READ_ENTRY (v2 only, as in BookKeeper): entries from ``start_entry_id`` on;
        ``callback(status, body)`` with the answer's body (``v2.batch_entries`` splits it). A v3
        connection answers EBADVERSION."""
        if self.use_v3:
            callback(StatusCode.EBADVERSION, b"")
            return
        key = (v2.OpCode.BATCH_READ_ENTRY, ledger_id, start_entry_id)
        if self._register_v2(key, callback):
            self._write(
                v2.encode_batch_read_request(
                    ledger_id, start_entry_id, next(self._txn_ids), max_count, max_size
                )
            )

    def read_long_poll(
        self,
        ledger_id: int,
        previous_lac: int,
        timeout_ms: int,
        callback: LongPollCallback,
    ) -> None:
        """A long-poll read (v3 READ_ENTRY with previousLAC, timeOut and ENTRY_PIGGYBACK): the
        bookie answers once its LAC passes ``previous_lac`` (with entry ``previous_lac + 1`` if it
        has it) or after ``timeout_ms`` (EOK, its LAC, no entry). v3 only: a v2 connection
        answers EBADVERSION."""
        if not self.use_v3:
            callback(StatusCode.EBADVERSION, b"", -1)
            return
        request = v3.long_poll_request(next(self._txn_ids), ledger_id, previous_lac, timeout_ms)
        sent: list[_Pending] = []

        def answered(status: StatusCode | None, body: bytes | errors.BKError) -> None:
            # (taken out of ``sent``: the pending request refers back to this function)
            taken = sent.pop() if sent else None
            callback(status, body, taken.max_lac if taken and status is not None else -1)

        pending = self._send_v3(request, answered, extra_wait_s=timeout_ms / 1000)
        if pending is not None:
            sent.append(pending)

    def force_ledger(self, ledger_id: int, callback: Callback) -> None:
        """FORCE_LEDGER (v3 only): the bookie answers once every entry of the ledger it
        acknowledged is durable."""
        if not self.use_v3:
            callback(StatusCode.EBADVERSION, b"")
            return
        request = self._v3_request(pb.FORCE_LEDGER)
        request.forceLedgerRequest.ledgerId = ledger_id
        self._send_v3(request, callback)

    def write_lac(
        self, ledger_id: int, lac: int, master_key: bytes, body: bytes, callback: Callback
    ) -> None:
        """Writes an explicit LAC (``body``: the digest-packaged LAC); ``callback(status, b"")``.
        Protocol v3 only, as in BookKeeper: a v2 connection answers EBADVERSION."""
        if not self.use_v3:
            callback(StatusCode.EBADVERSION, b"")
            return
        request = self._v3_request(pb.WRITE_LAC)
        write = request.writeLacRequest
        write.ledgerId, write.lac, write.masterKey, write.body = ledger_id, lac, master_key, body
        self._send_v3(request, callback)

    def read_lac(self, ledger_id: int, callback: ReadLacCallback) -> None:
        """READ_LAC (v3 only, as in BookKeeper): ``callback(status, explicit LAC body, last
        entry)``, either body empty when the bookie has none; a failure is ``(None, error,
        b"")``. A v2 connection answers EBADVERSION."""
        if not self.use_v3:
            callback(StatusCode.EBADVERSION, b"", b"")
            return
        request = self._v3_request(pb.READ_LAC)
        request.readLacRequest.ledgerId = ledger_id
        sent: list[_Pending] = []

        def answered(status: StatusCode | None, body: bytes | errors.BKError) -> None:
            callback(status, sent[0].lac_body if sent and status is not None else b"", body)

        pending = self._send_v3(request, answered)
        if pending is not None:
            sent.append(pending)

    def bookie_info(self, callback: DiskInfoCallback) -> None:
        """GET_BOOKIE_INFO (v3 only): the bookie's total and free disk space, in bytes, over its
        ledger directories (BookKeeper's ``getBookieInfo``). A v2 connection answers
        EBADVERSION."""
        if not self.use_v3:
            callback(StatusCode.EBADVERSION, 0, 0, None)
            return
        request = self._v3_request(pb.GET_BOOKIE_INFO)
        request.getBookieInfoRequest.requested = (
            pb.GetBookieInfoRequest.TOTAL_DISK_CAPACITY | pb.GetBookieInfoRequest.FREE_DISK_SPACE
        )
        sent: list[_Pending] = []

        def answered(status: StatusCode | None, body: bytes | errors.BKError) -> None:
            if status is None or not sent:
                callback(None, 0, 0, body if isinstance(body, errors.BKError) else None)
                return
            callback(status, *sent[0].disk, None)

        pending = self._send_v3(request, answered)
        if pending is not None:
            sent.append(pending)

    # -- responses -----------------------------------------------------------------------------

    def _decrypt(self, data: bytes) -> bytes:
        assert self._tls is not None
        plaintext, outgoing = self._tls.unwrap(data)
        if outgoing and self._transport is not None:
            self._transport.write(outgoing)
        if self._handshake is not None and self._tls.handshake_done:
            if not self._handshake.done():
                self._handshake.set_result(None)
            self._handshake = None
        return plaintext

    def data_received(self, data: bytes) -> None:
        if self._tls is not None:
            try:
                data = self._decrypt(data)
            except TlsError as error:
                log.error("TLS with bookie %s failed: %s", self.bookie_id, error)
                if self._transport is not None:
                    self._transport.abort()
                self._fail_all(TlsError(f"TLS with bookie {self.bookie_id} failed: {error}"))
                return
        try:
            frames = self._decoder.feed(data)
            if self._setup_answer is None and not self.use_v3:
                self._on_v2_frames(frames)
                return
            for frame in frames:
                if self._setup_answer is not None and not self._setup_answer.done():
                    self._setup_answer.set_result(frame)
                elif self.use_v3:
                    self._on_v3(v3.decode_response(frame))
                else:
                    self._on_v2_frames([frame])
        except (FrameError, MalformedMessageError) as error:
            log.error(
                "bookie %s sent a bad response (%s); dropping the connection", self.bookie_id, error
            )
            if self._transport is not None:
                self._transport.abort()
            self._fail_all(
                errors.ProtocolError(f"bookie {self.bookie_id} sent a malformed response: {error}")
            )

    def _on_v2_frames(self, frames: list[bytes]) -> None:
        """Completes the requests answered by ``frames``, in order, in one pass; the acks of a
        batch of adds reach its sink together, after the pass. The fixed part of each answer is
        read in place (no tuple of fields, no status object for an ack)."""
        if self._timers is not None:
            self._time_v2_answers(frames)
        unpack, pending, complete = _RESPONSE_HEAD.unpack_from, self._v2_pending, self._complete
        acks: dict[AddSink, list[int]]
        reads: dict[ReadSink, list[bytes]]
        if _take_answers is not None and not self._v2_more:
            # The C speedups take the run of plain add acks and read answers at the start;
            # this loop the rest.
            acks, reads, start = _take_answers(frames, pending, AddSink, ReadSink)
            if start:
                frames = frames[start:]
        else:
            acks, reads = {}, {}
        for frame in frames:
            if len(frame) < v2.RESPONSE_FIXED_SIZE:
                raise MalformedMessageError(f"v2 response of {len(frame)} bytes is shorter than 24")
            version, opcode, flags, rc, ledger_id, entry_id = unpack(frame)
            if version == 0:
                opcode = flags & 0xFF  # the legacy header: the opcode alone
            row = pending.get((opcode, ledger_id))
            if self._v2_more:
                request = self._take_v2(row, (opcode, ledger_id, entry_id))
            else:
                request = row.pop(entry_id, None) if row is not None else None
            if request is None:
                log.debug(
                    "bookie %s: response for %s nobody waits for (timed out?)",
                    self.bookie_id,
                    (opcode, ledger_id, entry_id),
                )
                continue
            target = request[0]
            if not isinstance(target, AddSink):
                if isinstance(target, ReadSink):
                    reads.setdefault(target, []).append(frame)
                    continue
                body = (
                    frame[v2.RESPONSE_FIXED_SIZE :] if len(frame) > v2.RESPONSE_FIXED_SIZE else b""
                )
                complete(cast(Callback, target), from_v2(rc), body)
            elif rc == 0:  # EOK
                acks.setdefault(target, []).append(entry_id)
            else:  # the acks it gave before come first, then the refusal
                if target in acks:
                    self._acked(target, acks.pop(target))
                try:
                    target.refused(entry_id, from_v2(rc))
                except Exception:  # a sink bug must not take the connection down
                    log.exception("answering a refused add failed")
        for sink, entry_ids in acks.items():
            self._acked(sink, entry_ids)
        for read_sink, answers in reads.items():
            try:
                read_sink.answered(answers)
            except Exception:  # a sink bug must not take the connection down
                log.exception("answering a batch of reads failed")

    @staticmethod
    def _acked(sink: AddSink, entry_ids: list[int]) -> None:
        try:
            sink.acked(entry_ids)
        except Exception:  # a sink bug must not take the connection down
            log.exception("answering a batch of adds failed")

    def _on_v3(self, response: pb.Response) -> None:
        request = self._v3_pending.pop(response.header.txnId, None)
        if request is None:
            return
        status = StatusCode(response.status)
        body = b""
        if response.HasField("readResponse"):
            status = StatusCode(response.readResponse.status)
            body = response.readResponse.body
            if response.readResponse.HasField("maxLAC"):
                request.max_lac = response.readResponse.maxLAC
        elif response.HasField("addResponse"):
            status = StatusCode(response.addResponse.status)
        elif response.HasField("writeLacResponse"):
            status = StatusCode(response.writeLacResponse.status)
        elif response.HasField("readLacResponse"):
            status = StatusCode(response.readLacResponse.status)
            request.lac_body = response.readLacResponse.lacBody
            body = response.readLacResponse.lastEntryBody
        elif response.HasField("forceLedgerResponse"):
            status = StatusCode(response.forceLedgerResponse.status)
        elif response.HasField("getBookieInfoResponse"):
            info = response.getBookieInfoResponse
            status = StatusCode(info.status)
            request.disk = (info.totalDiskCapacity, info.freeDiskSpace)
        if self._timers is not None:
            self._time_v3_answer(request, status)
        self._finish(request, status, body)


STATUS_ERRORS: dict[StatusCode, type[errors.BKError]] = {
    StatusCode.ENOLEDGER: errors.NoSuchLedgerError,
    StatusCode.ENOENTRY: errors.NoSuchEntryError,
    StatusCode.EBADREQ: errors.ProtocolError,
    StatusCode.EIO: errors.BookieIOError,
    StatusCode.EUA: errors.UnauthorizedAccessError,
    StatusCode.EBADVERSION: errors.ProtocolError,
    StatusCode.EFENCED: errors.LedgerFencedError,
    StatusCode.EREADONLY: errors.WriteOnReadOnlyBookieError,
    StatusCode.ETOOMANYREQUESTS: errors.TooManyRequestsError,
    StatusCode.EUNKNOWNLEDGERSTATE: errors.UnknownLedgerStateError,
}


STATUS_MEANINGS: dict[StatusCode, str] = {
    StatusCode.ENOLEDGER: "the bookie holds nothing of this ledger",
    StatusCode.ENOENTRY: "the bookie does not hold this entry",
    StatusCode.EBADREQ: "the bookie could not make sense of the request",
    StatusCode.EIO: "the bookie hit an I/O error or corrupt data; the answer is unknown",
    StatusCode.EUA: errors.EUA_MEANING,
    StatusCode.EBADVERSION: "the bookie does not speak this protocol version",
    StatusCode.EFENCED: "the ledger was fenced by a recovering reader; this writer may add nothing more",
    StatusCode.EREADONLY: "the bookie is read-only",
    StatusCode.ETOOMANYREQUESTS: "the bookie's queues are full; retry later",
    StatusCode.EUNKNOWNLEDGERSTATE: "the bookie cannot tell whether it holds the ledger",
}


def describe(status: StatusCode | None, problem: object) -> str:
    """A short account of a failed request: the bookie's status, or the local error."""
    return status.name if status is not None else str(problem)


def status_error(status: StatusCode, bookie_id: str, what: str) -> errors.BKError:
    """The exception for a bookie's non-OK answer."""
    meaning = STATUS_MEANINGS.get(status, "unexpected status")
    return STATUS_ERRORS.get(status, errors.BKError)(
        f"bookie {bookie_id} answered {status.name} to {what}: {meaning}"
    )


def _take_failure(future: asyncio.Future[BookieConnection]) -> None:
    if not future.cancelled():
        future.exception()


class BookiePool:
    """One connection per bookie, opened on first use and reopened after it drops."""

    def __init__(
        self,
        resolve: Callable[[str], Awaitable[tuple[str, int]]],
        *,
        use_v3: bool = False,
        connect_timeout_s: float = 5.0,
        request_timeout_s: float = 5.0,
        tls: TlsConfig | None = None,
        auth: ClientAuthProvider | None = None,
        clock: Clock | None = None,
        channel_stats: Callable[[str], ChannelStats] | None = None,
    ) -> None:
        """``channel_stats``: where each bookie's connections record their requests (the
        client's per-bookie metrics); None: nowhere."""
        self._resolve = resolve
        self._channel_stats = channel_stats
        self._clock = clock or MonotonicClock()
        self._use_v3 = use_v3
        self._tls = tls
        self._tls_context = tls.client_context() if tls is not None else None
        self._auth = auth
        self._connect_timeout_s = connect_timeout_s
        self._request_timeout_s = request_timeout_s
        self._closed = False
        self._connections: dict[tuple[str, bool], BookieConnection] = {}
        self._connecting: dict[tuple[str, bool], asyncio.Future[BookieConnection]] = {}

    def ready(self, bookie_id: str, v3: bool = False) -> BookieConnection | None:
        """An open connection to ``bookie_id``, if there is one (no waiting); with ``v3`` one
        speaking protocol v3 (a second connection when the pool speaks v2: long polls and the
        LAC requests exist only in v3, as in BookKeeper's client)."""
        connection = self._connections.get((bookie_id, v3 or self._use_v3))
        return connection if connection is not None and connection.is_open else None

    async def get(self, bookie_id: str, v3: bool = False) -> BookieConnection:
        connection = self.ready(bookie_id, v3)
        if connection is not None:
            return connection
        key = (bookie_id, v3 or self._use_v3)
        pending = self._connecting.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._connect(*key))
            # Every caller may have stopped waiting (cancelled): the failure is still taken.
            pending.add_done_callback(_take_failure)
            self._connecting[key] = pending
        return await asyncio.shield(pending)

    async def refuses(self, bookie_id: str, timeout_s: float) -> bool:
        """Whether ``bookie_id``'s address refuses connections (ECONNREFUSED: nothing listens
        there, its process is gone, although its registration may outlive it until its metadata
        session expires). An open connection, one made now, or an attempt that failed otherwise
        or took longer than ``timeout_s`` (a host that does not answer tells nothing) say no.
        ``MetadataStoreError`` when the bookie's address could not be looked up: the caller
        cannot tell, and must not guess."""
        if self.ready(bookie_id) is not None:
            return False
        try:
            await asyncio.wait_for(self.get(bookie_id), timeout_s)
        except errors.BookieHandleNotAvailableError as error:
            return isinstance(error.__cause__, ConnectionRefusedError)
        except errors.MetadataStoreError:
            raise
        except (errors.BKError, TimeoutError):
            return False  # connected, then TLS or authentication failed; or no answer
        return False

    async def _connect(self, bookie_id: str, use_v3: bool) -> BookieConnection:
        try:
            host, port = await self._resolve(bookie_id)
            stats = self._channel_stats(bookie_id) if self._channel_stats is not None else None
            started = self._clock.now()
            try:
                connection = await BookieConnection.connect(
                    bookie_id,
                    host,
                    port,
                    use_v3=use_v3,
                    connect_timeout_s=self._connect_timeout_s,
                    request_timeout_s=self._request_timeout_s,
                    tls=self._tls,
                    auth=self._auth,
                    tls_context=self._tls_context,
                    clock=self._clock,
                    stats=stats,
                )
            except errors.BKError:
                if stats is not None:
                    stats.connect.failure(self._clock.now() - started)
                    stats.failed_connections.inc()
                raise
            if stats is not None:
                stats.connect.success(self._clock.now() - started)
            if self._closed:
                connection.close()
                raise errors.ClientClosedError("the client was closed while connecting")
            self._connections[bookie_id, use_v3] = connection
            return connection
        finally:
            self._connecting.pop((bookie_id, use_v3), None)

    def close(self) -> None:
        """Closes every connection, and stops those still being made (a connection that
        completed after the close would keep its socket, and the loop, alive)."""
        self._closed = True
        for pending in list(self._connecting.values()):
            pending.cancel()
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
