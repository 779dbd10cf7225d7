"""``shell readledger`` over a real cluster: a range through the client (up to the last confirmed
entry, a live writer undisturbed), payloads as text, a hex dump or raw bytes, the entries one
bookie holds read from it alone, recovery with ``-r``; an unknown ledger, a bookie outside the
ledger and a backwards range are one-line errors that change nothing."""

from __future__ import annotations

import re
import subprocess
import sys

from bookkeeper_py import BookKeeper
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.testing import LocalCluster


def readledger(uri: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bookkeeper_py",
            "shell",
            "readledger",
            "--metadata-uri",
            uri,
            *args,
        ],
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )


HEADER = re.compile(rb"^--------- Lid=(\d+), Eid=(\d+), EntrySize=(\d+) ---------$", re.MULTILINE)


def test_readledger_ranges_formats_one_bookie_and_recovery(metadata_uri: str | None) -> None:
    payloads = [f"entry {i} of the ledger".encode() for i in range(12)]
    payloads[3] = bytes(range(40))  # binary, for the hex dump
    with (
        LocalCluster(3, metadata_uri=metadata_uri) as local,
        BookKeeper(local.metadata_uri) as client,
    ):
        handle = client.create_ledger(3, 2, 2, password=b"secret")
        for payload in payloads:
            handle.add_entry(payload)
        ledger_id = handle.ledger_id
        uri = local.metadata_uri

        # Through the client, the writer still open: entries up to the last confirmed one.
        every = readledger(uri, "-l", str(ledger_id), "-m")
        assert every.returncode == 0, every.stderr
        found = HEADER.findall(every.stdout)
        confirmed = client.open_ledger_no_recovery(ledger_id, b"secret").last_add_confirmed
        assert [int(eid) for _, eid, _ in found] == list(range(confirmed + 1))
        assert [int(size) for _, _, size in found] == [len(p) for p in payloads[: confirmed + 1]]
        assert b"entry 0 of the ledger\n" in every.stdout
        assert b"\\x00\\x01\\x02" in every.stdout  # control characters escaped
        assert handle.add_entry(b"still writing") == len(payloads)  # not fenced

        ranged = readledger(uri, "-l", str(ledger_id), "-fe", "2", "-le", "4", "-ef", "hex", "-m")
        assert ranged.returncode == 0, ranged.stderr
        assert [int(eid) for _, eid, _ in HEADER.findall(ranged.stdout)] == [2, 3, 4]
        assert (
            b"00000000 00 01 02 03 04 05 06 07 08 09 0A 0B 0C 0D 0E 0F ................"
            in ranged.stdout
        )
        assert b"00000010 65 6E 74 72 79 20 34" not in ranged.stdout  # entry 4 is text
        assert b"65 6E 74 72 79 20 34 20" in ranged.stdout  # "entry 4 " in hex

        raw = readledger(uri, "-l", str(ledger_id), "-fe", "0", "-le", "2", "-ef", "raw")
        assert raw.returncode == 0, raw.stderr
        assert raw.stdout == b"".join(payloads[:3])

        # One bookie alone: the entries its index in each write set gives it, and only those.
        ensemble = client.get_ledger_metadata(ledger_id).ensembles[0][1]
        bookie = ensemble[1]
        mine = [e for e in range(len(payloads)) if 1 in write_set(e, 3, 2)]
        alone = readledger(uri, "-l", str(ledger_id), "-b", bookie, "-le", str(len(payloads) - 1))
        assert alone.returncode == 0, alone.stderr
        assert [int(eid) for _, eid, _ in HEADER.findall(alone.stdout)] == mine

        # Bad input, the writer still open: one line on stderr, exit 1, nothing changed (the
        # ledger neither fenced nor recovered: its writer goes on).
        before = client.get_ledger_metadata(ledger_id)
        for args, wanted in (
            (["-l", "999999"], b"ledger 999999 does not exist"),
            (["-l", str(ledger_id), "-b", "127.0.0.1:1"], b"holds no fragment of ledger"),
            (["-l", str(ledger_id), "-fe", "5", "-le", "2"], b"is past the last"),
            (["-l", str(ledger_id), "-fe", "-3"], b"must be 0 or more"),
        ):
            failed = readledger(uri, *args)
            assert failed.returncode == 1, (args, failed.stdout, failed.stderr)
            assert wanted in failed.stderr and failed.stderr.count(b"\n") == 1, failed.stderr
            assert failed.stdout == b""
        assert client.get_ledger_metadata(ledger_id) == before
        assert not before.is_closed
        assert handle.add_entry(b"written after the bad input") == len(payloads) + 1

        # -r recovers: the writer is fenced, the ledger closed, every entry readable.
        recovered = readledger(uri, "-l", str(ledger_id), "-r")
        assert recovered.returncode == 0, recovered.stderr
        assert len(HEADER.findall(recovered.stdout)) == len(payloads) + 2
        assert client.get_ledger_metadata(ledger_id).is_closed
