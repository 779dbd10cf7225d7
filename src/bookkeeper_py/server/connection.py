"""One client connection to a bookie: TLS, framing, protocol detection, authentication,
dispatch, responses.

A connection speaks v3 while its frames parse as complete v3 ``Request``s; the first frame that
does not makes it v2 for good (as the Java bookie does: a v2 client may upgrade to TLS with the
one v3 ``START_TLS`` exchange and then speak v2). A connection whose first byte is 0x16 (a TLS
ClientHello) is TLS from the first byte. With an authentication provider configured, every
request other than ``AUTH`` and ``START_TLS`` is answered ``EUA`` until the plugin's exchange
succeeds. Responses are written as their operations complete, so v3 answers may leave out of
order (they carry the txnId).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import ssl
import struct
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from bookkeeper_py.auth import AuthenticationError, BookieAuthProvider, BookieAuthSession, PeerInfo
from bookkeeper_py.server.bookie import Bookie
from bookkeeper_py.tls import TLS_HANDSHAKE_RECORD, TlsError, TlsSession
from bookkeeper_py.wire import v2, v3
from bookkeeper_py.wire.errors import MalformedMessageError
from bookkeeper_py.wire.framing import FrameDecoder, FrameError
from bookkeeper_py.wire.output import OutputBuffer
from bookkeeper_py.wire.proto import bookkeeper_protocol_pb2 as pb
from bookkeeper_py.wire.status import StatusCode

log = logging.getLogger(__name__)
_ENTRY_ID = struct.Struct(">q")  # at offset 8 of a stored entry

WRITE_BUFFER_HIGH = 4 * 1024 * 1024
WRITE_BUFFER_LOW = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Security:
    """What a bookie asks of its connections: TLS (None: plain only) and authentication (None:
    every connection is authenticated)."""

    tls_context: ssl.SSLContext | None = None
    auth: BookieAuthProvider | None = None
    tls_required: bool = False  # mutual TLS: a plain connection has no certificate to check


_PLAIN_ADD = v2.PLAIN_ADD_HEAD
_PLAIN_ADD_MIN = v2.PLAIN_ADD_MIN_SIZE
_PLAIN_READ = v2.PLAIN_READ_HEAD
_PLAIN_READ_SIZE = v2.PLAIN_READ_SIZE
_MAX_RUN = 1024  # plain adds (or reads) taken in one run


def _is_plain_add(frame: bytes) -> bool:
    return frame.startswith(_PLAIN_ADD) and len(frame) >= _PLAIN_ADD_MIN


def _is_plain_read(frame: bytes) -> bool:
    return len(frame) == _PLAIN_READ_SIZE and frame.startswith(_PLAIN_READ)


class BookieConnection(asyncio.Protocol):
    """Serves one client socket."""

    def __init__(
        self,
        bookie: Bookie,
        connections: set[BookieConnection],
        security: Security | None = None,
    ) -> None:
        self._bookie = bookie
        self._connections = connections
        self._security = security or Security()
        self._tls: TlsSession | None = None
        self._first_bytes = True
        self._authenticated = self._security.auth is None
        self._auth_session: BookieAuthSession | None = None
        self._decoder = FrameDecoder(bookie.config.max_frame_size)
        self._transport: asyncio.Transport | None = None
        self._output: OutputBuffer | None = None  # frames of this loop pass, written together
        self._protocol: int | None = None  # 2 or 3 once detected
        self._peer = "?"
        self._backlog: collections.deque[bytes] = collections.deque()
        self._writing_paused = False
        self._stopped_reading = False
        self.pending = 0  # requests dispatched and not yet answered (each gets one answer)
        # At the bound of unanswered requests the connection is not read (see _hold) until
        # its pending requests fall to half of it.
        self._max_pending = bookie.config.max_pending_per_connection
        self._resume_at = self._max_pending // 2
        self._held = False
        self.last_activity = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._output = OutputBuffer(self._bookie.loop, self._send_now)
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        self._peer = str(transport.get_extra_info("peername"))
        self._set_socket_options(transport.get_extra_info("socket"))
        self._connections.add(self)

    def _set_socket_options(self, sock: Any) -> None:
        """serverTcpNoDelay, serverSockKeepalive and serverTcpLinger on the accepted socket."""
        if sock is None:
            return
        config = self._bookie.config
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(config.tcp_no_delay))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, int(config.tcp_keepalive))
            if config.tcp_linger_s >= 0:
                linger = struct.pack("ii", 1, config.tcp_linger_s)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        except OSError as error:  # the peer may be gone already
            log.debug("connection from %s: socket options not set: %s", self._peer, error)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._backlog.clear()
        self._connections.discard(self)

    # Back-pressure. A peer that does not read its answers stops being read: asyncio calls
    # pause_writing once the send buffer passes WRITE_BUFFER_HIGH, and frames already received
    # wait in the backlog until it drains below WRITE_BUFFER_LOW. Likewise a connection at its
    # bound of unanswered requests (maxPendingRequestsPerConnection) stops being read until half
    # of them are answered: its peer is slowed down, as by Java's maxAddsInProgressLimit, never
    # refused (an ETOOMANYREQUESTS would make a writer change its ensemble, and with no spare
    # bookie fail, for a stall of a few hundred milliseconds).

    def pause_writing(self) -> None:
        self._writing_paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._resume()

    def _hold(self) -> None:
        """At the bound of unanswered requests: stop reading until answers make room."""
        self._held = True
        self._bookie.connections_held.inc()
        if self._transport is not None:
            self._transport.pause_reading()

    def _answered(self, count: int) -> None:
        self.pending -= count
        if self._held and self.pending <= self._resume_at:
            self._held = False
            # After the answering callback: the backlog is not served from inside it.
            self._bookie.loop.call_soon(self._resume)

    def _resume(self) -> None:
        self._process_backlog()
        transport = self._transport
        if (
            transport is not None
            and not (self._writing_paused or self._held or self._stopped_reading)
            and not transport.is_closing()
        ):
            transport.resume_reading()

    def stop_reading(self) -> None:
        """Shutdown: take no new requests; those received are still answered."""
        self._stopped_reading = True
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def close(self) -> None:
        if self._output is not None:
            self._output.flush()  # answers already made go out before the close
        if self._transport is not None:
            self._transport.close()

    def _send(self, data: bytes) -> None:
        self._answered(1)
        self._write(data)

    def _write(self, data: bytes) -> None:
        if self._output is not None:
            self._output.write(data)

    def _send_now(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        try:
            transport.write(data if self._tls is None else self._tls.wrap(data))
        except TlsError as error:
            self._protocol_error(str(error))

    def _protocol_error(self, reason: str) -> None:
        log.warning("closing connection from %s: %s", self._peer, reason)
        if self._transport is not None:
            self._transport.abort()

    def _start_tls(self) -> None:
        assert self._security.tls_context is not None
        if self._output is not None:
            self._output.flush()  # the START_TLS answer goes out in plaintext
        self._tls = TlsSession(self._security.tls_context, server_side=True)

    def _decrypt(self, data: bytes) -> bytes | None:
        """The plaintext of received TLS bytes; None when the connection was closed."""
        assert self._tls is not None and self._transport is not None
        try:
            plaintext, outgoing = self._tls.unwrap(data)
        except TlsError as error:
            # Send the TLS alert (it tells the client why), then close.
            log.warning("closing connection from %s: %s", self._peer, error)
            self._transport.write(self._tls.take_outgoing())
            self._close_after_answer()
            return None
        if outgoing:
            self._transport.write(outgoing)
        return plaintext

    def data_received(self, data: bytes) -> None:
        self.last_activity = time.monotonic()
        if self._first_bytes and data:
            self._first_bytes = False
            if data[0] == TLS_HANDSHAKE_RECORD:
                if self._security.tls_context is None:
                    self._protocol_error("a TLS handshake, but this bookie has no TLS configured")
                    return
                self._start_tls()
        if self._tls is not None:
            plaintext = self._decrypt(data)
            if not plaintext:
                return
            data = plaintext
        if type(data) is not bytes:
            data = bytes(data)  # (a transport may hand over another buffer type)
        decoder = self._decoder
        backlog = self._backlog
        try:
            frames, position = decoder.complete(data)
            if frames:
                backlog.extend(frames)
                self._process_backlog()
            if position < len(data) and not backlog and self._serving_plain():
                # Plain adds straight out of the bytes received: no frame object each, one
                # copy fewer (the usual chunk of a writer's batch).
                position = self._cut_plain_adds(data, position)
            if position < len(data):
                backlog.extend(decoder.feed(data, position))
        except FrameError as error:
            self._protocol_error(str(error))
            return
        self._process_backlog()

    def _serving_plain(self) -> bool:
        """Requests are served now, in bulk: a v2 connection past authentication, not held at
        its bound of unanswered requests nor paused by its peer's reading."""
        return (
            self._protocol == 2
            and self._admitted
            and not (self._writing_paused or self._held)
            and self.pending < self._max_pending
            and self._transport is not None
        )

    def _run_room(self) -> int:
        """How many requests a run may take now: at most ``_MAX_RUN``, within the connection's
        bound of unanswered requests."""
        return min(_MAX_RUN, self._max_pending - self.pending)

    def _cut_plain_adds(self, data: bytes, position: int) -> int:
        """Serves the run of plain adds at ``position`` in ``data`` as ``_plain_adds`` serves
        one off the backlog; returns where the bytes it did not take begin."""
        room = self._run_room()
        groups, count, position = v2.cut_plain_adds(
            data, position, room, self._decoder.max_frame_size
        )
        self.pending += count
        self._add_groups(groups)
        return position

    def _process_backlog(self) -> None:
        backlog = self._backlog
        while (
            backlog
            and not (self._writing_paused or self._held)
            and self.pending < self._max_pending
        ):
            frame = backlog.popleft()
            if self._transport is None:
                backlog.clear()
                return
            if self._protocol == 2 and self._admitted:
                if _is_plain_add(frame):
                    self._plain_adds(frame)
                    continue
                if _is_plain_read(frame):
                    self._plain_reads(frame)
                    continue
            self.pending += 1
            try:
                if self._protocol != 2:
                    try:
                        request = v3.decode_request(frame)
                    except MalformedMessageError:
                        self._protocol = 2
                    else:
                        self._protocol = 3
                        self._handle_v3(request)
                        continue
                self._handle_v2(frame)
            except MalformedMessageError as error:
                backlog.clear()
                self._protocol_error(str(error))
                return
        if self.pending >= self._max_pending and not self._held:
            self._hold()  # at the bound: frames wait, and no more are read

    # -- authentication ------------------------------------------------------------------------

    @property
    def _admitted(self) -> bool:
        """Served beyond AUTH and START_TLS: authenticated, and over TLS when TLS is required
        (frames come out of a TLS session only once its handshake is done)."""
        return self._authenticated and (self._tls is not None or not self._security.tls_required)

    def _authenticate(self, plugin_name: str, payload: bytes) -> bytes | None:
        """The reply to one AUTH message, or None when it is refused (then the caller answers
        as its protocol allows and the connection is closed)."""
        provider = self._security.auth
        if provider is None or plugin_name != provider.plugin_name:
            log.warning(
                "connection from %s: AUTH with plugin %r, this bookie runs %r; refused",
                self._peer,
                plugin_name,
                provider.plugin_name if provider is not None else None,
            )
            return None
        if self._authenticated:
            log.warning("connection from %s: AUTH after authenticating; refused", self._peer)
            return None
        if self._security.tls_required and self._tls is None:
            log.warning(
                "connection from %s: AUTH before TLS, which is required; refused", self._peer
            )
            return None
        if self._auth_session is None:
            certificate = self._tls.peer_certificate() if self._tls is not None else None
            self._auth_session = provider.new_session(PeerInfo(self._peer, certificate))
        try:
            step = self._auth_session.process(payload)
        except AuthenticationError as error:
            log.warning("connection from %s: authentication failed: %s", self._peer, error)
            return None
        if step.principal is not None:
            self._authenticated = True
            log.info("connection from %s authenticated as %s", self._peer, step.principal)
        return step.reply

    def _close_after_answer(self) -> None:
        if self._output is not None:
            self._output.flush()
        self._backlog.clear()
        if self._transport is not None:
            self._transport.close()  # after the answer already written

    # -- v2 ------------------------------------------------------------------------------------

    def _handle_v2(self, frame: bytes) -> None:
        request = v2.decode_request(frame)
        if isinstance(request, v2.AuthRequest):
            reply = self._authenticate(request.plugin_name, request.payload)
            if reply is None:  # v2 AUTH answers carry no status: refusing is closing
                self._answered(1)
                self._close_after_answer()
                return
            self._send(v2.encode_auth(request.plugin_name, reply))
            return
        if not self._admitted:
            self._refuse_v2(request)
            return
        if isinstance(request, v2.AddRequest):
            lid, eid = request.ledger_id, request.entry_id

            def added(status: StatusCode) -> None:
                self._send(v2.encode_response(v2.OpCode.ADD_ENTRY, status, lid, eid))

            add = partial(
                self._bookie.add_entry,
                lid,
                eid,
                request.master_key,
                request.entry,
                request.is_recovery_add,
                added,
            )
            if request.is_recovery_add and not request.flags & v2.FLAG_HIGH_PRIORITY:
                self._bookie.in_background(partial(add, background=True))  # a copy
            else:
                add()
        elif isinstance(request, v2.ReadRequest):
            lid, eid = request.ledger_id, request.entry_id

            def read(status: StatusCode, body: bytes) -> None:
                self._send(v2.encode_response(v2.OpCode.READ_ENTRY, status, lid, eid, body))

            self._bookie.read_entry(lid, eid, request.is_fencing, request.master_key, read)
        elif isinstance(request, v2.BatchReadRequest):
            entries: list[bytes] = []
            if request.flags & v2.FLAG_DO_FENCING:
                status = StatusCode.EBADREQ  # fencing batch reads are not served
            else:
                status, entries = self._bookie.batch_read(
                    request.ledger_id, request.start_entry_id, request.max_count, request.max_size
                )
            self._send(
                v2.encode_batch_read_response(
                    status, request.ledger_id, request.start_entry_id, request.request_id, entries
                )
            )
        else:
            log.info(
                "v2 opcode %d from %s is not served; answering EBADREQ", request.opcode, self._peer
            )
            self._send(v2.encode_response(request.opcode, StatusCode.EBADREQ, -1, -1))

    def _plain_adds(self, first: bytes) -> None:
        """A run of plain v2 adds (``first`` and those right behind it in the backlog), stored
        in bulk: per ledger and master key, one call to the bookie and one write of the
        answers. Within the connection's bound of unanswered requests (``_process_backlog``
        serves no frame at the bound)."""
        room = self._run_room()
        groups, count = v2.take_plain_adds(self._backlog, first, room)
        self.pending += count
        self._add_groups(groups)

    def _add_groups(self, groups: list[v2.AddGroup]) -> None:
        add = self._bookie.add_entries
        for ledger_id, key, entry_ids, entries, lac in groups:
            add(ledger_id, key, entry_ids, entries, partial(self._added, ledger_id), lac)

    def _added(self, ledger_id: int, status: StatusCode, entry_ids: list[int]) -> None:
        self._answered(len(entry_ids))
        self._write(v2.encode_add_responses(status, ledger_id, entry_ids))

    def _plain_reads(self, first: bytes) -> None:
        """A run of plain v2 reads (not fencing), served in bulk: per ledger, one call to the
        bookie and one write of the answers it has at once (those waiting for a disk are
        answered when their reader thread is done). Within the connection's bound of
        unanswered requests, as ``_plain_adds``."""
        room = self._run_room()
        groups, count = v2.take_plain_reads(self._backlog, first, room)
        self.pending += count
        read = self._bookie.read_entries
        for ledger_id, entry_ids in groups:
            entries, statuses = read(ledger_id, entry_ids, partial(self._send_reads, ledger_id))
            self._send_reads(ledger_id, entry_ids, entries, statuses)

    def _send_reads(
        self,
        ledger_id: int,
        entry_ids: list[int],
        entries: list[bytes],
        statuses: dict[int, StatusCode],
    ) -> None:
        """The answers to the first ``len(entries)`` of ``entry_ids`` (see
        ``Bookie.read_entries``)."""
        if entries:
            self._answered(len(entries))
            self._write(v2.encode_read_responses(ledger_id, entry_ids, entries, statuses))

    def _refuse_v2(
        self, request: v2.AddRequest | v2.ReadRequest | v2.BatchReadRequest | v2.UnsupportedRequest
    ) -> None:
        """EUA in the request's own answer format: the connection is not authenticated."""
        if isinstance(request, v2.BatchReadRequest):
            self._send(
                v2.encode_batch_read_response(
                    StatusCode.EUA,
                    request.ledger_id,
                    request.start_entry_id,
                    request.request_id,
                    [],
                )
            )
        elif isinstance(request, (v2.AddRequest, v2.ReadRequest)):
            opcode = (
                v2.OpCode.ADD_ENTRY if isinstance(request, v2.AddRequest) else v2.OpCode.READ_ENTRY
            )
            self._send(
                v2.encode_response(opcode, StatusCode.EUA, request.ledger_id, request.entry_id)
            )
        else:
            self._send(v2.encode_response(request.opcode, StatusCode.EUA, -1, -1))

    # -- v3 ------------------------------------------------------------------------------------

    def _respond(self, request: pb.Request, status: StatusCode) -> pb.Response:
        response = pb.Response(status=int(status))  # type: ignore[arg-type]
        response.header.CopyFrom(request.header)
        return response

    def _handle_v3(self, request: pb.Request) -> None:
        operation = request.header.operation
        if not self._admitted and operation not in (pb.AUTH, pb.START_TLS):
            self._send(v3.encode(self._respond(request, StatusCode.EUA)))
            return
        if operation == pb.ADD_ENTRY and request.HasField("addRequest"):
            add = request.addRequest

            def added(status: StatusCode) -> None:
                response = self._respond(request, status)
                response.addResponse.status = int(status)  # type: ignore[assignment]
                response.addResponse.ledgerId = add.ledgerId
                response.addResponse.entryId = add.entryId
                self._send(v3.encode(response))

            recovery = add.HasField("flag") and add.flag == pb.AddRequest.RECOVERY_ADD
            deferred_sync = bool(add.writeFlags & v3.WRITE_FLAG_DEFERRED_SYNC)
            store = partial(
                self._bookie.add_entry,
                add.ledgerId,
                add.entryId,
                add.masterKey,
                add.body,
                recovery,
                added,
                deferred_sync,
            )
            if recovery and not request.header.priority:
                self._bookie.in_background(partial(store, background=True))  # a copy
            else:
                store()
        elif operation == pb.READ_ENTRY and request.HasField("readRequest"):
            read = request.readRequest

            def answered(status: StatusCode, body: bytes) -> None:
                response = self._respond(request, status)
                response.readResponse.status = int(status)  # type: ignore[assignment]
                response.readResponse.ledgerId = read.ledgerId
                response.readResponse.entryId = read.entryId
                if status == StatusCode.EOK:
                    response.readResponse.body = body
                self._send(v3.encode(response))

            if read.HasField("previousLAC"):
                # Long poll: parked until the LAC passes previousLAC, or for timeOut ms.
                def polled(status: StatusCode, body: bytes, max_lac: int) -> None:
                    response = self._respond(request, status)
                    response.readResponse.status = int(status)  # type: ignore[assignment]
                    response.readResponse.ledgerId = read.ledgerId
                    # The entry piggybacked, named by its own id (Java's client ignores a body
                    # answered under entry -1); else the id asked for.
                    response.readResponse.entryId = (
                        _ENTRY_ID.unpack_from(body, 8)[0]
                        if status == StatusCode.EOK and len(body) >= 16
                        else read.entryId
                    )
                    response.readResponse.maxLAC = max_lac
                    if status == StatusCode.EOK and body:
                        response.readResponse.body = body
                    self._send(v3.encode(response))

                piggyback = read.HasField("flag") and read.flag == pb.ReadRequest.ENTRY_PIGGYBACK
                timeout_s = max(0, read.timeOut) / 1000.0 if read.HasField("timeOut") else 0.0
                self._bookie.read_long_poll(
                    read.ledgerId, read.entryId, read.previousLAC, timeout_s, piggyback, polled
                )
                return
            fence = read.HasField("flag") and read.flag == pb.ReadRequest.FENCE_LEDGER
            if fence and not read.HasField("masterKey"):
                answered(StatusCode.EBADREQ, b"")
                return
            self._bookie.read_entry(read.ledgerId, read.entryId, fence, read.masterKey, answered)
        elif operation == pb.WRITE_LAC and request.HasField("writeLacRequest"):
            write = request.writeLacRequest

            def written(status: StatusCode) -> None:
                response = self._respond(request, status)
                response.writeLacResponse.status = int(status)  # type: ignore[assignment]
                response.writeLacResponse.ledgerId = write.ledgerId
                self._send(v3.encode(response))

            self._bookie.write_lac(write.ledgerId, write.masterKey, write.body, written)
        elif operation == pb.READ_LAC and request.HasField("readLacRequest"):
            ledger_id = request.readLacRequest.ledgerId
            status, lac_body, last_entry = self._bookie.read_lac(ledger_id)
            response = self._respond(request, status)
            response.readLacResponse.status = int(status)  # type: ignore[assignment]
            response.readLacResponse.ledgerId = ledger_id
            if lac_body is not None:
                response.readLacResponse.lacBody = lac_body
            if last_entry is not None:
                response.readLacResponse.lastEntryBody = last_entry
            self._send(v3.encode(response))
        elif operation == pb.FORCE_LEDGER and request.HasField("forceLedgerRequest"):
            ledger_id = request.forceLedgerRequest.ledgerId

            def forced(status: StatusCode) -> None:
                response = self._respond(request, status)
                response.forceLedgerResponse.status = int(status)  # type: ignore[assignment]
                response.forceLedgerResponse.ledgerId = ledger_id
                self._send(v3.encode(response))

            self._bookie.force_ledger(ledger_id, forced)
        elif operation == pb.GET_BOOKIE_INFO:
            total, free = self._bookie.disk_info()
            requested = (
                request.getBookieInfoRequest.requested
                if request.HasField("getBookieInfoRequest")
                else 0
            )
            response = self._respond(request, StatusCode.EOK)
            response.getBookieInfoResponse.status = pb.EOK
            if requested & pb.GetBookieInfoRequest.TOTAL_DISK_CAPACITY:
                response.getBookieInfoResponse.totalDiskCapacity = total
            if requested & pb.GetBookieInfoRequest.FREE_DISK_SPACE:
                response.getBookieInfoResponse.freeDiskSpace = free
            self._send(v3.encode(response))
        elif operation == pb.GET_LIST_OF_ENTRIES_OF_LEDGER and request.HasField(
            "getListOfEntriesOfLedgerRequest"
        ):
            ledger_id = request.getListOfEntriesOfLedgerRequest.ledgerId

            def listed(status: StatusCode, available: bytes) -> None:
                response = self._respond(request, status)
                listing = response.getListOfEntriesOfLedgerResponse
                listing.status = int(status)  # type: ignore[assignment]
                listing.ledgerId = ledger_id
                if status == StatusCode.EOK:
                    listing.availabilityOfEntriesOfLedger = available
                self._send(v3.encode(response))

            self._bookie.list_entries(ledger_id, listed)
        elif operation == pb.AUTH and request.HasField("authRequest"):
            message = request.authRequest
            reply = self._authenticate(message.authPluginName, message.payload)
            if reply is None:
                self._send(v3.encode(self._respond(request, StatusCode.EUA)))
                self._close_after_answer()
                return
            response = self._respond(request, StatusCode.EOK)
            response.authResponse.authPluginName = message.authPluginName
            response.authResponse.payload = reply
            self._send(v3.encode(response))
        elif operation == pb.START_TLS:
            self._upgrade_to_tls(request)
        else:
            log.info(
                "v3 operation %d from %s is not served; answering EBADREQ", operation, self._peer
            )
            self._send(v3.encode(self._respond(request, StatusCode.EBADREQ)))

    def _upgrade_to_tls(self, request: pb.Request) -> None:
        """START_TLS: answered in plaintext, then every byte is TLS (the client waits for the
        answer before its ClientHello, so nothing may follow the request)."""
        if self._security.tls_context is None or self._tls is not None:
            log.info(
                "START_TLS from %s refused: %s",
                self._peer,
                "already TLS" if self._tls is not None else "no TLS configured",
            )
            self._send(v3.encode(self._respond(request, StatusCode.EBADREQ)))
            return
        if self._backlog or self._decoder.buffered:
            self._protocol_error("bytes after START_TLS before its answer")
            return
        response = self._respond(request, StatusCode.EOK)
        response.startTLSResponse.SetInParent()
        self._send(v3.encode(response))
        self._start_tls()
