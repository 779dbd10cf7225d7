"""``/api/v1/ledger/{list,metadata,read,delete}`` on a bookie's HTTP port, over a real cluster:
BookKeeper's paths, parameters and JSON keys; bad input (a missing or malformed ledger id, an
unknown ledger, a backwards range, a range too long, a wrong method) is a 4xx with a one-line
reason and changes nothing."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

from bookkeeper_py import BookKeeper
from bookkeeper_py.metadata.format import deserialize
from bookkeeper_py.server.ledger_http import READ_LIMIT
from bookkeeper_py.testing import LocalCluster


def call(base: str, path: str, method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(base + path, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def test_ledger_endpoints_list_describe_read_and_delete(metadata_uri: str | None) -> None:
    with (
        LocalCluster(3, metadata_uri=metadata_uri) as local,
        BookKeeper(local.metadata_uri) as client,
    ):
        base = f"http://127.0.0.1:{local.bookies[0].http_port}/api/v1/ledger"
        closed = client.create_ledger(3, 2, 2, password=b"pw", custom_metadata={"app": b"demo"})
        for number in range(5):
            closed.add_entry(f"entry {number}".encode())
        closed.close()
        open_handle = client.create_ledger(2, 2, 1)
        for number in range(3):
            open_handle.add_entry(b"open %d" % number)
        ids = sorted([closed.ledger_id, open_handle.ledger_id])

        status, body = call(base, "/list")
        assert (status, json.loads(body)) == (200, {str(i): None for i in ids})
        status, body = call(base, "/list?print_metadata=true&decode_meta=true")
        listed = json.loads(body)
        assert status == 200 and sorted(map(int, listed)) == ids
        assert listed[str(closed.ledger_id)]["state"] == "CLOSED"
        status, body = call(base, "/list?print_metadata=true")  # the stored bytes, in base64
        stored = json.loads(body)[str(closed.ledger_id)]
        assert deserialize(
            closed.ledger_id, base64.b64decode(stored)
        ) == client.get_ledger_metadata(closed.ledger_id)
        status, body = call(base, "/list?print_metadata=true&decode_meta=true&page=2")
        assert (status, json.loads(body)) == (200, {})  # 100 a page: two ledgers fill no second

        status, body = call(base, f"/metadata?ledger_id={closed.ledger_id}")
        assert status == 200
        described = json.loads(body)[str(closed.ledger_id)]
        metadata = client.get_ledger_metadata(closed.ledger_id)
        assert list(described) == [
            "ledgerId", "metadataFormatVersion", "ensembleSize", "writeQuorumSize",
            "ackQuorumSize", "state", "length", "lastEntryId", "ctime", "digestType",
            "password", "customMetadata", "closed", "allEnsembles", "ctoken",
        ]  # fmt: skip
        assert described["ledgerId"] == closed.ledger_id
        assert (described["ensembleSize"], described["writeQuorumSize"]) == (3, 2)
        assert described["lastEntryId"] == 4 and described["closed"] is True
        assert described["length"] == metadata.length
        assert described["digestType"] == "CRC32C"
        assert base64.b64decode(described["password"]) == b"pw"
        assert described["customMetadata"] == {"app": base64.b64encode(b"demo").decode()}
        assert described["allEnsembles"] == {
            str(first): [{"id": bookie} for bookie in bookies]
            for first, bookies in metadata.ensembles
        }

        status, body = call(base, f"/read?ledger_id={closed.ledger_id}")
        assert (status, json.loads(body)) == (200, {str(i): f"entry {i}" for i in range(5)})
        status, body = call(
            base, f"/read?ledger_id={closed.ledger_id}&start_entry_id=1&end_entry_id=2"
        )
        assert json.loads(body) == {"1": "entry 1", "2": "entry 2"}
        status, body = call(base, f"/read?ledger_id={closed.ledger_id}&page=1")
        assert json.loads(body) == {
            "Entries for page: ": "1",
            **{str(i): f"entry {i}" for i in range(5)},
        }
        # An open ledger: its confirmed entries, its writer not fenced.
        status, body = call(base, f"/read?ledger_id={open_handle.ledger_id}&end_entry_id=9")
        confirmed = json.loads(body)
        assert status == 200 and confirmed and set(confirmed.values()) <= {
            "open 0", "open 1", "open 2",
        }  # fmt: skip
        assert open_handle.add_entry(b"open 3") == 3

        # Bad input: 4xx, one line, nothing changed (the open ledger's writer not fenced).
        before = client.list_ledgers()
        described_before = {i: client.get_ledger_metadata(i) for i in ids}
        for path, method, wanted_status, wanted in (
            ("/metadata", "GET", 400, b"missing parameter ledger_id"),
            ("/metadata?ledger_id=x7", "GET", 400, b"ledger_id must be a number"),
            ("/delete", "DELETE", 400, b"missing parameter ledger_id"),
            ("/delete?ledger_id=x", "DELETE", 400, b"ledger_id must be a number"),
            ("/list?page=x", "GET", 400, b"page must be a number"),
            ("/list?print_metadata=true&page=x", "GET", 400, b"page must be a number"),
            (
                f"/read?ledger_id={open_handle.ledger_id}&start_entry_id=x",
                "GET",
                400,
                b"start_entry_id must be a number",
            ),
            (
                f"/read?ledger_id={closed.ledger_id}&end_entry_id=2x",
                "GET",
                400,
                b"end_entry_id must be a number",
            ),
            (f"/read?ledger_id={closed.ledger_id}&page=one", "GET", 400, b"page must be a number"),
            ("/metadata?ledger_id=999999", "GET", 404, b"ledger 999999 does not exist"),
            ("/read?ledger_id=999999", "GET", 404, b"ledger 999999 does not exist"),
            (
                f"/read?ledger_id={closed.ledger_id}&start_entry_id=3&end_entry_id=1",
                "GET",
                400,
                b"do not make a range",
            ),
            (
                f"/read?ledger_id={open_handle.ledger_id}&end_entry_id={READ_LIMIT + 5}",
                "GET",
                200,
                b"",
            ),
            ("/delete?ledger_id=999999", "DELETE", 404, b"ledger 999999 does not exist"),
            (f"/delete?ledger_id={closed.ledger_id}", "GET", 405, b""),
            (f"/metadata?ledger_id={closed.ledger_id}", "PUT", 405, b""),
        ):
            status, body = call(base, path, method)
            assert status == wanted_status, (path, status, body)
            assert wanted in body and body.count(b"\n") <= (0 if status >= 400 else 99), body
        assert client.list_ledgers() == before
        assert {i: client.get_ledger_metadata(i) for i in ids} == described_before
        assert open_handle.add_entry(b"open 4") == 4

        status, body = call(base, f"/delete?ledger_id={closed.ledger_id}", "DELETE")
        assert (status, json.loads(body)) == (200, f"Deleted ledger: {closed.ledger_id}")
        assert client.list_ledgers() == [open_handle.ledger_id]


def test_a_read_of_more_entries_than_one_answer_holds_is_refused() -> None:
    with LocalCluster(1) as local, BookKeeper(local.metadata_uri) as client:
        base = f"http://127.0.0.1:{local.bookies[0].http_port}/api/v1/ledger"
        handle = client.create_ledger(1, 1, 1)
        futures = [handle.add_entry_async(b"e") for _ in range(READ_LIMIT + 1)]
        for future in futures:
            future.result(timeout=60)
        handle.close()
        status, body = call(base, f"/read?ledger_id={handle.ledger_id}")
        assert status == 400 and b"read at most" in body and b"\n" not in body
        status, body = call(base, f"/read?ledger_id={handle.ledger_id}&page=11")
        assert (status, json.loads(body)) == (200, {"Entries for page: ": "11", "10000": "e"})
