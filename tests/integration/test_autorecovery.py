"""Issue 20 over real processes: AutoRecovery in the bookies brings a killed bookie's data back to
full replication by itself (checked replica by replica), a bookie restarted within
lostBookieRecoveryDelay causes nothing, the auditor is re-elected when its bookie dies, and the
operator's recover (dry run, then for real) and decommissionbookie of a live bookie, from the
shell and over REST. A killed bookie is known dead by the refusal of its address, before its
registration (its metadata session) ends. An id the cluster does not know is refused before
anything starts, and every refusal leaves the cluster as it was."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bookkeeper_py import BookKeeper, DigestType
from bookkeeper_py.client.client import BookKeeper as AsyncBookKeeper
from bookkeeper_py.core.metadata import LedgerMetadata
from bookkeeper_py.core.quorum import write_set
from bookkeeper_py.metadata.manager import MetadataClient
from bookkeeper_py.metadata.port import run_blocking
from bookkeeper_py.metadata.underreplication import UnderReplication
from bookkeeper_py.testing import LocalCluster
from bookkeeper_py.testing.waiting import wait_for
from bookkeeper_py.testing.zookeeper import ZooKeeperServer
from bookkeeper_py.wire.digest import DigestManager
from bookkeeper_py.wire.status import StatusCode

from .workloads import payload

PASSWORD = b"ar"
FAST = [
    "--autorecovery",
    "true",
    "--open-ledger-grace-ms",
    "60000",  # longer than the tests: a live writer is never fenced by a worker
]
UNKNOWN = "127.0.0.1:1"  # no cookie, never registered, in no ensemble


def write_closed_ledgers(uri: str, count: int, entries: int) -> dict[int, list[bytes]]:
    """``count`` closed ledgers at 3/2/2: ledger id -> the payloads written."""
    written: dict[int, list[bytes]] = {}
    with BookKeeper(uri) as client:
        for number in range(count):
            handle = client.create_ledger(3, 2, 2, DigestType.CRC32C, PASSWORD)
            data = [
                payload(entry, 100 + (number * 7 + entry) % 900, number) for entry in range(entries)
            ]
            futures = [handle.add_entry_async(one) for one in data]
            for future in futures:
                future.result(60)
            handle.close()
            written[handle.ledger_id] = data
    return written


class Writer:
    """A live writer adding to an open 3/2/2 ledger in a thread until stopped; every add's
    outcome is kept."""

    def __init__(self, uri: str) -> None:
        self.client = BookKeeper(uri)
        self.handle = self.client.create_ledger(3, 2, 2, DigestType.CRC32C, PASSWORD)
        self.acked: list[bytes] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        entry = 0
        while not self._stop.is_set() and entry < 100_000:
            data = payload(entry, 200, 999)
            try:
                self.handle.add_entry_async(data).result(60)
                self.acked.append(data)
            except Exception as error:  # the test asserts there is none
                self.failures.append(f"entry {entry}: {error}")
                return
            entry += 1
            time.sleep(0.005)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(60)
        self.handle.close()
        ledger_id = self.handle.ledger_id
        self.client.close()
        return ledger_id


async def _replicas_identical(
    uri: str, expected: dict[int, list[bytes]], live: set[str]
) -> list[str]:
    """Problems found reading every entry from every replica the metadata names (each bookie
    asked directly, no failover): [] when every copy is there, byte-identical, with the
    payload written."""
    problems: list[str] = []
    async with AsyncBookKeeper(uri) as client:
        for ledger_id, payloads in expected.items():
            metadata: LedgerMetadata = await client.get_ledger_metadata(ledger_id)
            named = metadata.bookies() - live
            if named:
                problems.append(f"ledger {ledger_id} names {sorted(named)}, not live")
                continue
            digest = DigestManager(ledger_id, metadata.digest_type, PASSWORD)
            for entry_id, data in enumerate(payloads):
                ensemble = metadata.ensemble_at(entry_id)
                copies = set()
                for index in write_set(
                    entry_id, metadata.ensemble_size, metadata.write_quorum_size
                ):
                    status, body = await client.bookie_client.read_entry(
                        ensemble[index], ledger_id, entry_id
                    )
                    if status != StatusCode.EOK:
                        problems.append(
                            f"ledger {ledger_id} entry {entry_id} on {ensemble[index]}: {status.name}"
                        )
                        continue
                    if digest.verify(body, entry_id).payload != data:
                        problems.append(
                            f"ledger {ledger_id} entry {entry_id} on {ensemble[index]}: wrong payload"
                        )
                    copies.add(bytes(body))
                if len(copies) > 1:
                    problems.append(f"ledger {ledger_id} entry {entry_id}: replicas differ")
    return problems


def markers_of(uri: str) -> list[int]:
    async def marked(port) -> list[int]:  # type: ignore[no-untyped-def]
        return await (await UnderReplication(port).ensure_layout()).marked()

    with MetadataClient.connect(uri) as metadata:
        return run_blocking(metadata, marked)


def names_only(uri: str, ledgers: list[int], live: set[str]) -> bool:
    with MetadataClient.connect(uri) as metadata:
        return all(metadata.read_ledger_metadata(one)[0].bookies() <= live for one in ledgers)


def cookies_and_registrations(
    uri: str,
) -> tuple[dict[str, tuple[bytes, int] | None], list[str], list[str]]:
    """Every cookie (text and version), and the writable and read-only registrations."""
    with MetadataClient.connect(uri) as metadata:
        names = metadata.store.children(f"{metadata.root}/cookies")
        cookies = {name: metadata.read_cookie(name) for name in sorted(names)}
        return cookies, sorted(metadata.writable_bookies()), sorted(metadata.readonly_bookies())


def refused(result: subprocess.CompletedProcess[str], text: str) -> bool:
    """The command failed with exit 1 and one line on stderr containing ``text``, and printed
    nothing on stdout."""
    return (
        result.returncode == 1
        and result.stdout == ""
        and result.stderr.count("\n") == 1
        and result.stderr.startswith("error: ")
        and text in result.stderr
    )


def shell(uri: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", "shell", *args, "--metadata-uri", uri],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(params=["sqlite", pytest.param("zookeeper", marks=pytest.mark.zookeeper)])
def store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    """None (the embedded SQLite store) or a root on the session's real ZooKeeper."""
    if request.param == "zookeeper":
        server: ZooKeeperServer = request.getfixturevalue("zookeeper")
        return server.metadata_uri(f"/autorecovery-{tmp_path.name}")
    return None


def test_autorecovery_brings_a_killed_bookie_s_ledgers_back_to_full_replication(
    store_uri: str | None,
) -> None:
    with LocalCluster(4, metadata_uri=store_uri, bookie_args=FAST) as cluster:
        uri = cluster.metadata_uri
        written = write_closed_ledgers(uri, 200, 12)
        writer = Writer(uri)
        wait_for(lambda: len(writer.acked) > 50, 60, "the live writer's first adds")
        # The victim is in the writer's ensemble: the writer replaces it while workers copy
        # the ledger's earlier fragment (both change its metadata).
        ((_, ensemble),) = writer.handle.metadata.ensembles
        victim = ensemble[1]
        cluster.kill_bookie(cluster.bookie_ids.index(victim))
        live = set(cluster.bookie_ids) - {victim}
        wait_for(
            lambda: (
                names_only(uri, [*written, writer.handle.ledger_id], live) and not markers_of(uri)
            ),
            240,
            "every ledger re-replicated off the killed bookie and no marker left",
            interval_s=0.5,
        )
        time.sleep(0.5)
        open_ledger = writer.stop()
        assert writer.failures == []
        written[open_ledger] = writer.acked
        # The open ledger was closed by its writer; the auditor and workers finish it too.
        wait_for(
            lambda: names_only(uri, list(written), live) and not markers_of(uri),
            240,
            "the writer's ledger re-replicated too",
            interval_s=0.5,
        )
        assert asyncio.run(_replicas_identical(uri, written, live)) == []
        # The auditor is one of the live bookies, and the shell says which.
        result = shell(uri, "whoisauditor")
        assert result.returncode == 0 and result.stdout.split(": ")[1].strip() in live


def test_a_bookie_restarted_within_the_delay_causes_no_replication() -> None:
    with LocalCluster(4, bookie_args=FAST) as cluster:
        uri = cluster.metadata_uri
        written = write_closed_ledgers(uri, 20, 5)
        assert shell(uri, "lostbookierecoverydelay", "-s", "30").returncode == 0
        wait_for(lambda: shell(uri, "whoisauditor").returncode == 0, 60, "an auditor elected")
        auditor = shell(uri, "whoisauditor").stdout.split(": ")[1].strip()
        index = next(i for i, b in enumerate(cluster.bookie_ids) if b != auditor)
        restarted = cluster.bookie_ids[index]
        killed_at = time.monotonic()
        cluster.kill_bookie(index)
        # Gone from the registry (its lease expired): the auditor sees it lost.
        with MetadataClient.connect(uri) as metadata:
            wait_for(
                lambda: restarted not in metadata.writable_bookies(), 60, "the registration gone"
            )
        cluster.start_bookie(index)
        # Watched until well past the moment it went away: never a marker.
        while time.monotonic() - killed_at < 20:
            assert markers_of(uri) == []
            time.sleep(0.5)
        assert names_only(uri, list(written), set(cluster.bookie_ids))
        # Told to audit now, the auditor finds nothing lost.
        assert shell(uri, "triggeraudit").returncode == 0
        time.sleep(2)
        assert markers_of(uri) == []


def test_the_auditor_s_bookie_killed_is_replaced_before_its_registration_ends() -> None:
    """The auditor's bookie is killed; its registration and its vote outlive it by a minute
    (zkTimeout). The other candidates see its address refuse connections and withdraw its vote:
    another auditor is elected, and the killed bookie's ledgers are marked and copied, all while
    its registration is still there."""
    lingering = [*FAST, "--zk-timeout-ms", "60000"]
    with LocalCluster(4, bookie_args=lingering) as cluster:
        uri = cluster.metadata_uri
        written = write_closed_ledgers(uri, 20, 5)
        wait_for(lambda: shell(uri, "whoisauditor").returncode == 0, 60, "an auditor elected")
        first = shell(uri, "whoisauditor").stdout.split(": ")[1].strip()
        cluster.kill_bookie(cluster.bookie_ids.index(first))
        live = set(cluster.bookie_ids) - {first}

        def another() -> bool:
            result = shell(uri, "whoisauditor")
            return result.returncode == 0 and result.stdout.split(": ")[1].strip() != first

        wait_for(another, 60, "another auditor elected", interval_s=0.5)
        wait_for(
            lambda: names_only(uri, list(written), live) and not markers_of(uri),
            60,
            "every ledger re-replicated off the killed auditor's bookie",
            interval_s=0.5,
        )
        with MetadataClient.connect(uri) as metadata:
            assert first in metadata.writable_bookies()  # its session has not expired yet
        assert asyncio.run(_replicas_identical(uri, written, live)) == []


def test_recover_dry_run_changes_nothing_then_recover_copies_everything() -> None:
    """The victim is known only by the ensembles naming it (its cookie deleted, its registration
    ended): it is recovered. An id the cluster never knew is refused and nothing changes."""
    with LocalCluster(4) as cluster:  # no AutoRecovery: the operator recovers
        uri = cluster.metadata_uri
        written = write_closed_ledgers(uri, 30, 10)
        victim = cluster.bookie_ids[2]
        cluster.kill_bookie(2)
        live = set(cluster.bookie_ids) - {victim}
        with MetadataClient.connect(uri) as metadata:
            metadata.delete_cookie(victim)
            wait_for(
                lambda: victim not in metadata.writable_bookies() + metadata.readonly_bookies(),
                60,
                "the killed bookie's registration gone (its lease ended)",
                interval_s=0.2,
            )
            before = {one: metadata.read_ledger_metadata(one) for one in written}
        for args in ([UNKNOWN], [f"{victim},{UNKNOWN}"], ["a/b"]):
            result = shell(uri, "recover", *args)
            expected = "'a/b' is not a bookie id" if args == ["a/b"] else f"no bookie {UNKNOWN} "
            assert refused(result, expected), (args, result)
        with MetadataClient.connect(uri) as metadata:
            assert {one: metadata.read_ledger_metadata(one) for one in written} == before
        dry = shell(uri, "recover", victim, "-dr")
        assert dry.returncode == 0, dry.stderr
        on_victim = [one for one, (md, _) in before.items() if victim in md.bookies()]
        assert on_victim and all(f"ledger {one} (closed)" in dry.stdout for one in on_victim)
        with MetadataClient.connect(uri) as metadata:
            assert {one: metadata.read_ledger_metadata(one) for one in written} == before
        done = shell(uri, "recover", victim)
        assert done.returncode == 0, done.stderr
        assert f"recovered {len(on_victim)} of {len(on_victim)} ledgers" in done.stdout
        assert asyncio.run(_replicas_identical(uri, written, live)) == []


def test_decommissioning_a_live_bookie_moves_its_data_and_stops_it() -> None:
    with LocalCluster(4) as cluster:
        uri = cluster.metadata_uri
        written = write_closed_ledgers(uri, 30, 10)
        leaving = cluster.bookie_ids[0]
        process = cluster.bookies[0].process
        assert process is not None
        result = shell(uri, "decommissionbookie", "-bookieid", leaving, timeout=600)
        assert result.returncode == 0, result.stderr
        assert f"bookie {leaving} decommissioned and stopped" in result.stdout
        process.wait(60)  # the bookie's process ended by itself
        live = set(cluster.bookie_ids) - {leaving}
        assert asyncio.run(_replicas_identical(uri, written, live)) == []
        with MetadataClient.connect(uri) as metadata:
            assert metadata.read_cookie(leaving) is None
            assert leaving not in metadata.writable_bookies() + metadata.readonly_bookies()
        # A bookie id the cluster never knew is refused in one line; nothing changes.
        state = cookies_and_registrations(uri)
        unknown = shell(uri, "decommissionbookie", "-bookieid", UNKNOWN)
        assert refused(unknown, f"no bookie {UNKNOWN} in this cluster"), unknown
        assert cookies_and_registrations(uri) == state


def test_autorecovery_runs_as_a_process_of_its_own() -> None:
    with LocalCluster(4) as cluster:
        uri = cluster.metadata_uri
        written = write_closed_ledgers(uri, 20, 8)
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bookkeeper_py",
                "autorecovery",
                "--metadata-uri",
                uri,
                "--name",
                "ar-1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ},
        )
        try:
            wait_for(
                lambda: shell(uri, "whoisauditor").stdout.strip() == "Auditor: ar-1",
                60,
                "ar-1 elected",
            )
            victim = cluster.bookie_ids[3]
            cluster.kill_bookie(3)
            live = set(cluster.bookie_ids) - {victim}
            wait_for(
                lambda: names_only(uri, list(written), live) and not markers_of(uri),
                180,
                "re-replicated by the autorecovery process",
                interval_s=0.5,
            )
            assert asyncio.run(_replicas_identical(uri, written, live)) == []
        finally:
            process.terminate()
            _, errors = process.communicate(timeout=30)
        assert process.returncode == 0, errors


def http(
    cluster: LocalCluster, method: str, path: str, body: object = None, *, raw: bytes | None = None
) -> tuple[int, str]:
    """(status, body) of a request to the first bookie's HTTP port: ``body`` sent as JSON, or
    ``raw`` as it is."""
    import json
    import urllib.error
    import urllib.request

    data = raw if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster.bookies[0].http_port}{path}", data=data, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_autorecovery_rest_endpoints() -> None:
    import json

    with LocalCluster(4) as cluster:
        uri = cluster.metadata_uri
        api = "/api/v1/autorecovery"
        assert http(cluster, "GET", f"{api}/status") == (200, '{"enabled": true}')
        assert http(cluster, "PUT", f"{api}/status?enabled=false") == (200, '{"enabled": false}')
        assert http(cluster, "GET", f"{api}/status")[1] == '{"enabled": false}'
        assert http(cluster, "PUT", f"{api}/status?enabled=maybe") == (
            400,
            "give ?enabled=true or ?enabled=false",
        )
        assert http(cluster, "GET", f"{api}/status") == (200, '{"enabled": false}')
        http(cluster, "PUT", f"{api}/status?enabled=true")
        assert http(cluster, "PUT", f"{api}/lost_bookie_recovery_delay", {"delay_seconds": 7}) == (
            200,
            "Success set lostBookieRecoveryDelay to 7",
        )
        assert http(cluster, "GET", f"{api}/lost_bookie_recovery_delay") == (
            200,
            "lostBookieRecoveryDelay value: 7",
        )
        delay_wanted = 'expected a JSON body {"delay_seconds": N} with N seconds, 0 or more'
        for bad in ({"delay": 7}, {"delay_seconds": -1}, {"delay_seconds": True}, -1, "7"):
            assert http(cluster, "PUT", f"{api}/lost_bookie_recovery_delay", bad) == (
                400,
                delay_wanted,
            ), bad
        assert_not_json(cluster, f"{api}/lost_bookie_recovery_delay")
        assert http(cluster, "GET", f"{api}/lost_bookie_recovery_delay") == (
            200,
            "lostBookieRecoveryDelay value: 7",
        )
        assert http(cluster, "GET", f"{api}/who_is_auditor") == (404, "No auditor elected")
        # The shell says the same, in one line.
        assert refused(shell(uri, "whoisauditor"), "no auditor: no AutoRecovery process runs")
        assert http(cluster, "PUT", f"{api}/trigger_audit") == (200, "Success trigger audit.")
        assert http(cluster, "GET", f"{api}/list_under_replicated_ledger") == (
            404,
            "No under replicated ledgers found",
        )

        async def mark(port) -> None:  # type: ignore[no-untyped-def]
            markers = await UnderReplication(port).ensure_layout()
            await markers.mark(7, ["a:1"])
            await markers.mark(9, ["b:2", "a:1"])

        with MetadataClient.connect(uri) as metadata:
            run_blocking(metadata, mark)
        assert http(cluster, "GET", f"{api}/list_under_replicated_ledger") == (200, "[7, 9]")
        status, text = http(
            cluster,
            "GET",
            f"{api}/list_under_replicated_ledger?missingreplica=b:2&printmissingreplica",
        )
        assert status == 200 and json.loads(text) == {"9": ["b:2", "a:1"]}
        # Recovery in the background, followed through the progress endpoint.
        written = write_closed_ledgers(uri, 10, 10)
        victim = cluster.bookie_ids[3]
        # Refused before anything starts: bad bodies, ids that cannot be one, unknown ids (alone
        # or beside a known one). Nothing is started, no cookie or registration changes.
        state = cookies_and_registrations(uri)
        refusals: list[tuple[str, object, int, str]] = [
            ("bookie", {"bookie": victim}, 400, 'expected a JSON body {"bookie_src": ['),
            ("bookie", {"bookie_src": []}, 400, 'expected a JSON body {"bookie_src": ['),
            ("bookie", {"bookie_src": [3]}, 400, 'expected a JSON body {"bookie_src": ['),
            ("bookie", {"bookie_src": ["a/b"]}, 400, "'a/b' is not a bookie id"),
            ("bookie", {"bookie_src": [UNKNOWN]}, 404, f"no bookie {UNKNOWN} in this cluster"),
            ("bookie", {"bookie_src": [victim, UNKNOWN]}, 404, f"no bookie {UNKNOWN} in"),
            ("decommission", {"bookie_src": 3}, 400, 'expected a JSON body {"bookie_src": "'),
            ("decommission", {"bookie_src": ""}, 400, 'expected a JSON body {"bookie_src": "'),
            ("decommission", {"bookie_src": "a b"}, 400, "'a b' is not a bookie id"),
            ("decommission", {"bookie_src": UNKNOWN}, 404, f"no bookie {UNKNOWN} in this"),
        ]
        for endpoint, body, wanted_status, wanted_text in refusals:
            status, text = http(cluster, "PUT", f"{api}/{endpoint}", body)
            assert status == wanted_status and text.startswith(wanted_text), (body, text)
            assert "\n" not in text
        for endpoint in ("bookie", "decommission"):
            assert_not_json(cluster, f"{api}/{endpoint}")
        assert http(cluster, "GET", f"{api}/progress") == (200, "[]")
        assert cookies_and_registrations(uri) == state
        cluster.kill_bookie(3)
        status, text = http(cluster, "PUT", f"{api}/bookie", {"bookie_src": [victim]})
        assert (
            status == 200
            and json.loads(text)["message"] == "Success send recovery request command."
        )

        def finished() -> bool:
            (operation,) = json.loads(http(cluster, "GET", f"{api}/progress")[1])
            return operation["state"] == "done"

        wait_for(finished, 120, "the recovery started over REST done")
        (operation,) = json.loads(http(cluster, "GET", f"{api}/progress")[1])
        assert operation["operation"] == "recover" and operation["bookies"] == [victim]
        live = set(cluster.bookie_ids) - {victim}
        assert asyncio.run(_replicas_identical(uri, written, live)) == []
        progress = operations(cluster)
        assert http(cluster, "PUT", f"{api}/decommission", {"bookie_src": 3})[0] == 400
        assert http(cluster, "PUT", f"{api}/bookie", {"bookie_src": [UNKNOWN]})[0] == 404
        assert operations(cluster) == progress


def operations(cluster: LocalCluster) -> list[dict[str, object]]:
    """The operations ``GET progress`` lists; a running one without its rate (which depends on
    when it is asked; a finished one's stays as it ended)."""
    import json

    status, text = http(cluster, "GET", "/api/v1/autorecovery/progress")
    assert status == 200, text
    listed: list[dict[str, object]] = json.loads(text)
    for operation in listed:
        if operation["state"] == "running":
            del operation["bytesPerSecond"]
    return listed


def assert_not_json(cluster: LocalCluster, path: str) -> None:
    """A PUT whose body is not JSON is refused in one line."""
    status, text = http(cluster, "PUT", path, raw=b"not json")
    assert status == 400 and text.startswith("the request body is not JSON: "), text
    assert "\n" not in text


def test_decommission_and_auditor_over_rest() -> None:
    """who_is_auditor names the elected auditor (the shell too); PUT decommission moves a live
    bookie's data to the others and removes it, followed through progress."""
    import json

    with LocalCluster(4, bookie_args=FAST) as cluster:
        uri = cluster.metadata_uri
        api = "/api/v1/autorecovery"
        written = write_closed_ledgers(uri, 10, 10)
        wait_for(
            lambda: http(cluster, "GET", f"{api}/who_is_auditor")[0] == 200,
            60,
            "an auditor elected",
            interval_s=0.2,
        )
        status, text = http(cluster, "GET", f"{api}/who_is_auditor")
        assert status == 200 and text.startswith("Auditor: "), text
        assert text.removeprefix("Auditor: ") in cluster.bookie_ids
        assert shell(uri, "whoisauditor").stdout == f"{text}\n"
        leaving = cluster.bookie_ids[3]
        process = cluster.bookies[3].process
        assert process is not None
        assert http(cluster, "PUT", f"{api}/decommission", {"bookie_src": leaving}) == (
            200,
            json.dumps({"message": f"Success send decommission Bookie command {leaving}", "id": 1}),
        )

        def finished() -> bool:
            (operation,) = json.loads(http(cluster, "GET", f"{api}/progress")[1])
            return bool(operation["state"] != "running")

        wait_for(finished, 300, "the decommission started over REST finished", interval_s=0.2)
        (operation,) = json.loads(http(cluster, "GET", f"{api}/progress")[1])
        assert operation["state"] == "done", operation["message"]
        assert operation["operation"] == "decommission" and operation["bookies"] == [leaving]
        process.wait(60)  # the bookie's process ended by itself
        live = set(cluster.bookie_ids) - {leaving}
        with MetadataClient.connect(uri) as metadata:
            assert metadata.read_cookie(leaving) is None
            assert leaving not in metadata.writable_bookies() + metadata.readonly_bookies()
        assert names_only(uri, list(written), live)
        assert asyncio.run(_replicas_identical(uri, written, live)) == []


def test_the_ledger_check_finds_entries_a_live_bookie_lost_and_a_worker_copies_them() -> None:
    """A ledger whose metadata names a live bookie that never got its entries (as after a
    replaced disk): the auditor's periodic check marks it, naming that bookie, and a worker
    copies the entries to another bookie."""
    from bookkeeper_py.autorecovery.auditor import Auditor
    from bookkeeper_py.autorecovery.worker import ReplicationWorker
    from bookkeeper_py.metadata.port import update_ledger_metadata

    with LocalCluster(5) as cluster:
        uri = cluster.metadata_uri
        written = write_closed_ledgers(uri, 1, 20)
        ((ledger_id, _),) = written.items()

        async def scenario() -> tuple[set[str], list[int], list[int]]:
            async with AsyncBookKeeper(uri) as client:
                port = client.metadata_port
                metadata, _ = await port.read_ledger_metadata(ledger_id)
                ((_, ensemble),) = metadata.ensembles
                empty = next(b for b in cluster.bookie_ids if b not in ensemble)
                await update_ledger_metadata(
                    port, ledger_id, lambda _: True, lambda md: md.with_members(0, {2: empty})
                )
                markers = await UnderReplication(port).ensure_layout()
                auditor = Auditor(client, markers)
                assert await auditor.check_ledgers() == 1
                marked = await markers.marked()
                missing = await markers.missing_replicas(ledger_id)
                worker = ReplicationWorker(client, markers, "test-worker")
                assert await markers.acquire(ledger_id, "test-worker")
                assert await worker.replicate(ledger_id)
                return {empty, *(missing or [])}, marked, await markers.marked()

        named, marked, left = asyncio.run(scenario())
        assert marked == [ledger_id] and len(named) == 1 and left == []
        with MetadataClient.connect(uri) as metadata:
            after, _ = metadata.read_ledger_metadata(ledger_id)
        assert not after.bookies() & named
        assert asyncio.run(_replicas_identical(uri, written, set(cluster.bookie_ids))) == []
