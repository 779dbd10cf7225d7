"""Entry packaging and digests, as BookKeeper's client digest managers build them (reference 2.4, 2.5).

An entry on the wire and on a bookie's disk is::

     0  int64 ledgerId
     8  int64 entryId
    16  int64 lastAddConfirmed    the writer's LAC when it sent this entry
    24  int64 length              cumulative ledger length including this payload
    32  digest                    0 / 4 / 8 / 20 bytes by digest type
    ..  payload

The digest covers bytes 0-31 and then the payload. All integers are big-endian. A LAC body
(WRITE_LAC) is ``ledgerId(8) | lac(8) | digest`` with the digest over the first 16 bytes.
Bookies never check digests: they store and return the bytes unchanged.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import crc32c as _crc32c

from bookkeeper_py.errors import DigestMismatchError
from bookkeeper_py.speedups import native

# The C speedups (``bookkeeper_py.speedups``), where they are in use.
_c_payload: Callable[[bytes, int, int], bytes | None] | None = None
_c_package: Callable[[int, int, int, int, bytes], bytes] | None = None
_c_package_run: Callable[[int, int, int, list[int], list[bytes]], list[bytes]] | None = None
if native is not None:
    _c_payload, _c_package = native.crc32c_payload, native.crc32c_package
    _c_package_run = native.crc32c_package_run

HEADER = struct.Struct(">qqqq")
HEADER_SIZE = HEADER.size  # 32
LAC_HEADER = struct.Struct(">qq")
_IDS = struct.Struct(">qq")
_U32 = struct.Struct(">I")
_CRC32C_END = HEADER_SIZE + 4  # where a CRC32C entry's payload starts
MASTER_KEY_SIZE = 20


class DigestType(enum.IntEnum):
    """Digest types, numbered as in ledger metadata (``LedgerMetadataFormat.DigestType``)."""

    CRC32 = 1
    MAC = 2  # HMAC-SHA1; the metadata enum calls it HMAC
    CRC32C = 3
    DUMMY = 4

    @property
    def digest_size(self) -> int:
        """Bytes the digest takes in an entry."""
        return _DIGEST_SIZES[self]


_DIGEST_SIZES = {DigestType.CRC32: 8, DigestType.MAC: 20, DigestType.CRC32C: 4, DigestType.DUMMY: 0}


def master_key(password: bytes) -> bytes:
    """The 20-byte key a bookie checks on writes and fences: SHA-1("ledger" || password)."""
    return hashlib.sha1(b"ledger" + password).digest()


def mac_key(password: bytes) -> bytes:
    """The HMAC-SHA1 key of MAC digests: SHA-1("mac" || password)."""
    return hashlib.sha1(b"mac" + password).digest()


@dataclass(frozen=True, slots=True)
class Entry:
    """An entry after its digest was verified."""

    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    length: int
    payload: bytes


def peek_header(entry: bytes | memoryview) -> tuple[int, int, int, int]:
    """(ledgerId, entryId, lastAddConfirmed, length) of packaged entry bytes, unchecked.

    Bookies use this to index an entry; raises ``ValueError`` when the bytes are too short.
    """
    if len(entry) < HEADER_SIZE:
        raise ValueError(f"entry of {len(entry)} bytes is shorter than its 32-byte header")
    ledger_id, entry_id, lac, length = HEADER.unpack_from(entry, 0)
    return ledger_id, entry_id, lac, length


class DigestManager:
    """Packages and verifies the entries of one ledger with one digest type and password."""

    __slots__ = ("_digest", "_mac_key", "digest_size", "digest_type", "ledger_id")

    def __init__(self, ledger_id: int, digest_type: DigestType, password: bytes) -> None:
        self.ledger_id = ledger_id
        self.digest_type = digest_type
        self.digest_size = digest_type.digest_size
        self._mac_key = mac_key(password)
        self._digest = {
            DigestType.CRC32: self._crc32,
            DigestType.MAC: self._hmac,
            DigestType.CRC32C: self._crc32c,
            DigestType.DUMMY: self._dummy,
        }[digest_type]

    @staticmethod
    def _crc32(header: bytes, payload: bytes | memoryview) -> bytes:
        # Java's CRC32 digest stores the 32-bit value in a long: 4 zero bytes, then the CRC.
        return struct.pack(">q", zlib.crc32(payload, zlib.crc32(header)))

    @staticmethod
    def _crc32c(header: bytes, payload: bytes | memoryview) -> bytes:
        return struct.pack(">I", _crc32c.crc32c(payload, _crc32c.crc32c(header)))

    def _hmac(self, header: bytes, payload: bytes | memoryview) -> bytes:
        mac = hmac.new(self._mac_key, header, hashlib.sha1)
        mac.update(payload)
        return mac.digest()

    @staticmethod
    def _dummy(header: bytes, payload: bytes | memoryview) -> bytes:
        return b""

    def package(self, entry_id: int, last_add_confirmed: int, length: int, payload: bytes) -> bytes:
        """The bytes sent to bookies for ``payload`` as entry ``entry_id``."""
        if _c_package is not None and self.digest_type is DigestType.CRC32C:
            return _c_package(self.ledger_id, entry_id, last_add_confirmed, length, payload)
        header = HEADER.pack(self.ledger_id, entry_id, last_add_confirmed, length)
        return b"".join((header, self._digest(header, payload), payload))

    def package_run(
        self,
        first_entry_id: int,
        last_add_confirmed: int,
        lengths: list[int],
        payloads: list[bytes],
    ) -> list[bytes]:
        """``package`` of ``payloads`` as entries ``first_entry_id``, ``first_entry_id + 1``,
        ..., each carrying ``last_add_confirmed`` and its ledger length in ``lengths``."""
        if _c_package_run is not None and self.digest_type is DigestType.CRC32C:
            return _c_package_run(
                self.ledger_id, first_entry_id, last_add_confirmed, lengths, payloads
            )
        package = self.package
        return [
            package(entry_id, last_add_confirmed, length, payload)
            for entry_id, length, payload in zip(
                range(first_entry_id, first_entry_id + len(payloads)),
                lengths,
                payloads,
                strict=True,
            )
        ]

    def verify(self, data: bytes | memoryview, expected_entry_id: int) -> Entry:
        """Checks the digest of entry bytes read from a bookie and that they are the entry asked for."""
        view = memoryview(data)
        if len(view) < HEADER_SIZE + self.digest_size:
            raise DigestMismatchError(
                f"ledger {self.ledger_id} entry {expected_entry_id}: {len(view)} bytes is too short "
                f"for a {self.digest_type.name} entry"
            )
        header = bytes(view[:HEADER_SIZE])
        ledger_id, entry_id, lac, length = HEADER.unpack(header)
        stored = view[HEADER_SIZE : HEADER_SIZE + self.digest_size]
        payload = view[HEADER_SIZE + self.digest_size :]
        expected = self._digest(header, payload)
        if not hmac.compare_digest(expected, stored):
            raise DigestMismatchError(
                f"ledger {self.ledger_id} entry {expected_entry_id}: {self.digest_type.name} digest "
                f"mismatch (stored {bytes(stored).hex()}, computed {expected.hex()}); "
                "the data is corrupt or the password or digest type is wrong"
            )
        if ledger_id != self.ledger_id or entry_id != expected_entry_id:
            raise DigestMismatchError(
                f"asked for ledger {self.ledger_id} entry {expected_entry_id}, "
                f"got ledger {ledger_id} entry {entry_id}"
            )
        return Entry(ledger_id, entry_id, lac, length, bytes(payload))

    def payload(self, data: bytes, entry_id: int) -> bytes:
        """``verify(data, entry_id).payload``, made without the ``Entry`` for the common
        digests (a range read's path); the same checks, the same errors."""
        if _c_payload is not None and self.digest_type is DigestType.CRC32C:
            checked = _c_payload(data, self.ledger_id, entry_id)
            if checked is not None:
                return checked
        elif self.digest_type is DigestType.CRC32C and len(data) >= _CRC32C_END:
            ledger_id, got_id = _IDS.unpack_from(data)
            view = memoryview(data)
            crc = _crc32c.crc32c(view[_CRC32C_END:], _crc32c.crc32c(view[:HEADER_SIZE]))
            if (
                crc == _U32.unpack_from(data, HEADER_SIZE)[0]
                and ledger_id == self.ledger_id
                and got_id == entry_id
            ):
                return data[_CRC32C_END:]
        return self.verify(data, entry_id).payload  # the other digests; or the error, said

    def verify_read(self, data: bytes | memoryview, requested_entry_id: int) -> Entry:
        """``verify`` for the answer to a read of ``requested_entry_id``; -1 asks for the
        bookie's last entry, whatever its id. Raises ``ValueError`` for bytes too short for a
        header."""
        expected = peek_header(data)[1] if requested_entry_id == -1 else requested_entry_id
        return self.verify(data, expected)

    def package_lac(self, lac: int) -> bytes:
        """The body of a WRITE_LAC request."""
        header = LAC_HEADER.pack(self.ledger_id, lac)
        return header + self._digest(header, b"")

    def verify_lac(self, data: bytes | memoryview) -> int:
        """The LAC carried by a LAC body, after checking its digest."""
        view = memoryview(data)
        if len(view) < LAC_HEADER.size + self.digest_size:
            raise DigestMismatchError(
                f"ledger {self.ledger_id}: LAC body of {len(view)} bytes is too short"
            )
        header = bytes(view[: LAC_HEADER.size])
        ledger_id, lac = LAC_HEADER.unpack(header)
        stored = view[LAC_HEADER.size : LAC_HEADER.size + self.digest_size]
        if (
            not hmac.compare_digest(self._digest(header, b""), stored)
            or ledger_id != self.ledger_id
        ):
            raise DigestMismatchError(f"ledger {self.ledger_id}: LAC body failed its digest check")
        return int(lac)
