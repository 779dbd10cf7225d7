"""Issue 15, item 6: a bookie that lost journal records it had acknowledged (a damaged last group
cut off as a torn write) used to answer "no such entry" for them. It now answers
EUNKNOWNLEDGERSTATE for its ledgers until it has repaired them from the other replicas; a corrupt
group in the middle of a journal stops it with one line saying what to do."""

from __future__ import annotations

import os
import shutil
import socket
import struct
from pathlib import Path

import pytest

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.client.facade import LedgerHandle
from bookkeeper_py.server.limbo import LIMBO_FILE
from bookkeeper_py.storage.journal import (
    CorruptJournalError,
    RecordType,
    journal_name,
    list_journal_ids,
    scan,
)
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.local_cluster import BookieProcess
from bookkeeper_py.testing.raw import recv_frame
from bookkeeper_py.testing.waiting import wait_for
from bookkeeper_py.wire import v2
from bookkeeper_py.wire.status import StatusCode

from .test_cli_errors import bookkeeper, one_line_error
from .workloads import payload

PASSWORD = b"limbo"
NO_CHECKPOINT = ["--flush-interval-ms", "3600000"]  # the journal holds every entry


def groups(path: str) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """(start, end, [(ledger, entry) of its entries]) of every group of a journal file."""
    found: list[tuple[int, int, list[tuple[int, int]]]] = []
    start = 16  # the file header
    for record_type, body, group_end in scan(path, is_last=False):
        if not found or found[-1][1] != group_end:
            found.append((found[-1][1] if found else start, group_end, []))
        if record_type == RecordType.ENTRY:
            found[-1][2].append(struct.unpack_from(">qq", body))
    return found


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


def read(port: int, ledger_id: int, entry_id: int) -> tuple[StatusCode, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(v2.encode_read_request(ledger_id, entry_id))
        answer = v2.decode_response(recv_frame(connection))
        return answer.status, answer.body


def last_journal(directory: str) -> str:
    return os.path.join(directory, journal_name(list_journal_ids(directory)[-1]))


def write_then_kill(
    cluster: LocalCluster, client: BookKeeper, count: int, ack_quorum: int, victim_index: int
) -> tuple[LedgerHandle, BookieProcess]:
    """A 3/3/``ack_quorum`` ledger of ``count`` entries written one at a time (a journal group
    each, unless the victim falls behind), then bookie ``victim_index`` killed once it stored
    the last one (with Qa < 3 the add may be acknowledged before its copy lands there)."""
    writer = client.create_ledger(3, 3, ack_quorum, DigestType.CRC32C, PASSWORD)
    for i in range(count):
        writer.add_entry(payload(i, 100))
    victim = cluster.bookies[victim_index]
    # A bookie adds an entry to its ledger storage before its journal group is written, so a
    # read that finds it does not yet mean the journal holds it: wait for the journal itself.
    wait_for(
        lambda: journal_holds(victim.journal_directory, writer.ledger_id, count - 1),
        30,
        "the last entry in the victim's journal",
    )
    cluster.kill_bookie(victim_index)
    return writer, victim


def journal_holds(directory: str, ledger_id: int, entry_id: int) -> bool:
    """The newest journal file of ``directory`` has a complete group holding the entry."""
    try:
        return any(
            (ledger_id, entry_id) in records for _, _, records in groups(last_journal(directory))
        )
    except (CorruptJournalError, IndexError):  # a group being written; no journal file yet
        return False


def holds_the_last_entries(records: list[tuple[int, int]], ledger_id: int, last: int) -> bool:
    """A journal group holds the ledger's last entries, up to ``last``: one alone, or a few when
    this bookie fell behind the others that made the quorum and its journal grouped them."""
    ids = [entry_id for _, entry_id in records]
    return (
        bool(ids)
        and all(ledger == ledger_id for ledger, _ in records)
        and ids == list(range(last - len(ids) + 1, last + 1))
    )


@pytest.mark.slow
def test_a_bookie_that_cut_acknowledged_records_answers_unknown_until_repaired(
    tmp_path: Path,
) -> None:
    count = 400
    with (
        LocalCluster(3, base_directory=str(tmp_path), bookie_args=NO_CHECKPOINT) as cluster,
        BookKeeper(cluster.metadata_uri) as client,
    ):
        # Qa = 1: an open ledger's entry may have been acknowledged by the damaged bookie alone,
        # so it stays unknown until the ledger is closed.
        writer, victim = write_then_kill(cluster, client, count, 1, 0)
        journal = last_journal(victim.journal_directory)
        start, end, lost = groups(journal)[-1]
        assert holds_the_last_entries(lost, writer.ledger_id, count - 1)  # stored by all three
        flip(journal, (start + end) // 2)  # the last group damaged: cut as a torn tail
        cluster.start_bookie(0)
        # Before: ENOENTRY for an entry it had acknowledged. Now: unknown, as for a ledger
        # it never heard of, and for "the last entry".
        assert read(victim.port, writer.ledger_id, count - 1)[0] == (StatusCode.EUNKNOWNLEDGERSTATE)
        assert read(victim.port, writer.ledger_id, -1)[0] == StatusCode.EUNKNOWNLEDGERSTATE
        assert read(victim.port, 999_999, 0)[0] == StatusCode.EUNKNOWNLEDGERSTATE
        status, body = read(victim.port, writer.ledger_id, 5)  # what it holds is served
        assert status == StatusCode.EOK and body.endswith(payload(5, 100))
        limbo = os.path.join(victim.directory, "ledgers", LIMBO_FILE)
        assert os.path.exists(limbo)
        # An open ledger waits for its close; then the lost entry is copied back.
        writer.close()
        wait_for(lambda: not os.path.exists(limbo), 60, "the bookie to leave limbo")
        status, body = read(victim.port, writer.ledger_id, count - 1)
        assert status == StatusCode.EOK
        assert body == read(cluster.bookies[1].port, writer.ledger_id, count - 1)[1]
        assert read(victim.port, 999_999, 0)[0] == StatusCode.ENOLEDGER  # trusted again
        reader = client.open_ledger(writer.ledger_id, PASSWORD)
        assert [e.data for e in reader.read_entries(0, count - 1)] == [
            payload(i, 100) for i in range(count)
        ]


@pytest.mark.slow
def test_a_corrupt_group_in_the_middle_of_a_journal_stops_the_bookie_in_one_line(
    tmp_path: Path,
) -> None:
    with (
        LocalCluster(3, base_directory=str(tmp_path), bookie_args=NO_CHECKPOINT) as cluster,
        BookKeeper(cluster.metadata_uri) as client,
    ):
        writer = client.create_ledger(3, 3, 2, DigestType.CRC32C, PASSWORD)
        for i in range(50):
            writer.add_entry(payload(i, 100))
        writer.close()
        victim = cluster.bookies[2]
        cluster.kill_bookie(2)
        journal = last_journal(victim.journal_directory)
        start, end, _ = groups(journal)[10]
        flip(journal, (start + end) // 2)
        result = bookkeeper(
            "bookie", "--metadata-uri", cluster.metadata_uri, "--host", "127.0.0.1",
            "--port", str(victim.port), "--journal-dir", victim.journal_directory,
        )  # fmt: skip
        error = one_line_error(result)
        assert f"journal {journal} is corrupt at offset {start}" in error
        assert "Move that file out of the journal directory" in error
        # Following the advice: the bookie starts in limbo and repairs the closed ledger.
        shutil.move(journal, tmp_path / "damaged.txn")
        cluster.start_bookie(2)
        limbo = os.path.join(victim.directory, "ledgers", LIMBO_FILE)
        wait_for(lambda: not os.path.exists(limbo), 60, "the bookie to leave limbo")
        for entry_id in range(50):
            status, body = read(victim.port, writer.ledger_id, entry_id)
            assert status == StatusCode.EOK and body.endswith(payload(entry_id, 100))


@pytest.mark.slow
def test_an_open_ledger_with_qa_two_is_repaired_without_waiting_for_its_close(
    tmp_path: Path,
) -> None:
    """With Qa >= 2, an entry the damaged bookie acknowledged has a copy on another member of
    the fragment: the repair copies back everything up to the highest entry the others hold,
    while the writer keeps the ledger open."""
    count = 200
    with (
        LocalCluster(3, base_directory=str(tmp_path), bookie_args=NO_CHECKPOINT) as cluster,
        BookKeeper(cluster.metadata_uri) as client,
    ):
        writer, victim = write_then_kill(cluster, client, count, 2, 1)
        journal = last_journal(victim.journal_directory)
        start, end, lost = groups(journal)[-1]
        assert holds_the_last_entries(lost, writer.ledger_id, count - 1)
        flip(journal, (start + end) // 2)
        cluster.start_bookie(1)
        limbo = os.path.join(victim.directory, "ledgers", LIMBO_FILE)
        wait_for(lambda: not os.path.exists(limbo), 60, "the bookie to leave limbo")
        assert not writer.is_closed
        status, body = read(victim.port, writer.ledger_id, count - 1)
        assert status == StatusCode.EOK and body.endswith(payload(count - 1, 100))
        assert writer.add_entry(payload(count, 100)) == count  # the writer goes on


@pytest.mark.slow
def test_a_journal_file_deleted_by_hand_puts_the_bookie_in_limbo_until_repaired(
    tmp_path: Path,
) -> None:
    """A journal file after the LastLogMark removed while the bookie was down (an operator
    freeing space): the entries only it held are gone on this bookie, which must say unknown,
    not absent, until it has copied them back from the others."""
    count = 100
    with (
        LocalCluster(3, base_directory=str(tmp_path), bookie_args=NO_CHECKPOINT) as cluster,
        BookKeeper(cluster.metadata_uri) as client,
    ):
        writer, victim = write_then_kill(cluster, client, count, 1, 2)
        os.remove(last_journal(victim.journal_directory))
        cluster.start_bookie(2)
        limbo = os.path.join(victim.directory, "ledgers", LIMBO_FILE)
        assert os.path.exists(limbo)
        for entry_id in (0, count - 1, -1):
            assert read(victim.port, writer.ledger_id, entry_id)[0] == (
                StatusCode.EUNKNOWNLEDGERSTATE
            )
        writer.close()  # Qa = 1: an open ledger waits for its close
        wait_for(lambda: not os.path.exists(limbo), 60, "the bookie to leave limbo")
        for entry_id in range(count):
            status, body = read(victim.port, writer.ledger_id, entry_id)
            assert status == StatusCode.EOK and body.endswith(payload(entry_id, 100))
