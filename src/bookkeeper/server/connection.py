"""One client connection to a bookie: framing, protocol detection, dispatch, responses.

The first frame decides the connection's protocol for good: a frame that parses as a complete
v3 ``Request`` makes it v3, anything else v2 (as the Java bookie does). Responses are written as
their operations complete, so v3 answers may leave out of order (they carry the txnId).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import cast

from bookkeeper.server.bookie import Bookie
from bookkeeper.wire import v2, v3
from bookkeeper.wire.errors import MalformedMessageError
from bookkeeper.wire.framing import FrameDecoder, FrameError
from bookkeeper.wire.proto import bookkeeper_protocol_pb2 as pb
from bookkeeper.wire.status import StatusCode

log = logging.getLogger(__name__)

WRITE_FLAG_DEFERRED_SYNC = 0x1  # AddRequest.writeFlags
WRITE_BUFFER_HIGH = 4 * 1024 * 1024
WRITE_BUFFER_LOW = 1024 * 1024


class BookieConnection(asyncio.Protocol):
    """Serves one client socket."""

    def __init__(self, bookie: Bookie, connections: set[BookieConnection]) -> None:
        self._bookie = bookie
        self._connections = connections
        self._decoder = FrameDecoder(bookie.config.max_frame_size)
        self._transport: asyncio.Transport | None = None
        self._protocol: int | None = None  # 2 or 3 once detected
        self._peer = "?"
        self._backlog: collections.deque[bytes] = collections.deque()
        self._writing_paused = False
        self.pending = 0  # requests dispatched and not yet answered (each gets one answer)
        self.last_activity = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        self._peer = str(transport.get_extra_info("peername"))
        self._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._backlog.clear()
        self._connections.discard(self)

    # Back-pressure: a peer that does not read its answers stops being read. asyncio calls
    # pause_writing once the send buffer passes WRITE_BUFFER_HIGH; frames already received wait
    # in the backlog until it drains below WRITE_BUFFER_LOW.

    def pause_writing(self) -> None:
        self._writing_paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._process_backlog()
        if self._transport is not None and not self._writing_paused:
            self._transport.resume_reading()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _over_limit(self) -> bool:
        """Past the per-connection bound of unanswered requests (the current one included)."""
        return self.pending > self._bookie.config.max_pending_per_connection

    def _send(self, data: bytes) -> None:
        self.pending -= 1
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _protocol_error(self, reason: str) -> None:
        log.warning("closing connection from %s: %s", self._peer, reason)
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        self.last_activity = time.monotonic()
        try:
            frames = self._decoder.feed(data)
        except FrameError as error:
            self._protocol_error(str(error))
            return
        self._backlog.extend(frames)
        self._process_backlog()

    def _process_backlog(self) -> None:
        backlog = self._backlog
        while backlog and not self._writing_paused:
            frame = backlog.popleft()
            if self._transport is None:
                backlog.clear()
                return
            self.pending += 1
            try:
                if self._protocol is None:
                    self._protocol = 3 if v3.is_v3_request(frame) else 2
                if self._protocol == 3:
                    self._handle_v3(v3.decode_request(frame))
                else:
                    self._handle_v2(frame)
            except MalformedMessageError as error:
                backlog.clear()
                self._protocol_error(str(error))
                return

    # -- v2 ------------------------------------------------------------------------------------

    def _handle_v2(self, frame: bytes) -> None:
        request = v2.decode_request(frame)
        if isinstance(request, v2.AddRequest):
            lid, eid = request.ledger_id, request.entry_id

            def added(status: StatusCode) -> None:
                self._send(v2.encode_response(v2.OpCode.ADD_ENTRY, status, lid, eid))

            if self._over_limit():
                added(StatusCode.ETOOMANYREQUESTS)
                return
            self._bookie.add_entry(
                lid, eid, request.master_key, request.entry, request.is_recovery_add, added
            )
        elif isinstance(request, v2.ReadRequest):
            lid, eid = request.ledger_id, request.entry_id

            def read(status: StatusCode, body: bytes) -> None:
                self._send(v2.encode_response(v2.OpCode.READ_ENTRY, status, lid, eid, body))

            if self._over_limit():
                read(StatusCode.ETOOMANYREQUESTS, b"")
                return
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

    # -- v3 ------------------------------------------------------------------------------------

    def _respond(self, request: pb.Request, status: StatusCode) -> pb.Response:
        response = pb.Response(status=int(status))  # type: ignore[arg-type]
        response.header.CopyFrom(request.header)
        return response

    def _handle_v3(self, request: pb.Request) -> None:
        operation = request.header.operation
        if operation == pb.ADD_ENTRY and request.HasField("addRequest"):
            add = request.addRequest

            def added(status: StatusCode) -> None:
                response = self._respond(request, status)
                response.addResponse.status = int(status)  # type: ignore[assignment]
                response.addResponse.ledgerId = add.ledgerId
                response.addResponse.entryId = add.entryId
                self._send(v3.encode(response))

            if self._over_limit():
                added(StatusCode.ETOOMANYREQUESTS)
                return
            recovery = add.HasField("flag") and add.flag == pb.AddRequest.RECOVERY_ADD
            deferred_sync = bool(add.writeFlags & WRITE_FLAG_DEFERRED_SYNC)
            self._bookie.add_entry(
                add.ledgerId, add.entryId, add.masterKey, add.body, recovery, added, deferred_sync
            )
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

            if self._over_limit():
                answered(StatusCode.ETOOMANYREQUESTS, b"")
                return
            if read.HasField("previousLAC"):
                # Long poll: parked until the LAC passes previousLAC, or for timeOut ms.
                def polled(status: StatusCode, body: bytes, max_lac: int) -> None:
                    response = self._respond(request, status)
                    response.readResponse.status = int(status)  # type: ignore[assignment]
                    response.readResponse.ledgerId = read.ledgerId
                    response.readResponse.entryId = read.entryId
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

            if self._over_limit():
                listed(StatusCode.ETOOMANYREQUESTS, b"")
                return
            self._bookie.list_entries(ledger_id, listed)
        else:
            log.info(
                "v3 operation %d from %s is not served; answering EBADREQ", operation, self._peer
            )
            self._send(v3.encode(self._respond(request, StatusCode.EBADREQ)))
