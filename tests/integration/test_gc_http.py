"""``/api/v1/bookie/gc``, ``gc_details``, ``gc/suspend_compaction`` and ``gc/resume_compaction``
on a real bookie: a forced round runs in the background and shows in the details; a suspended
kind is left out of a forced round that does not name it, and runs when named; bad input is a
400 with a one-line reason and changes nothing; other methods are 405."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from bookkeeper_py.testing import LocalCluster


def call(base: str, path: str, method: str = "GET", body: bytes | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(base + path, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


def details_after_round(base: str, before: dict[str, Any]) -> dict[str, Any]:
    """The GC details once the forced round asked for has ended (bounded wait)."""
    for _ in range(600):
        _, found = call(base, "/gc")
        _, details = call(base, "/gc_details")
        counted = details[0]["majorCompactionCounter"] + details[0]["minorCompactionCounter"]
        if found == {"is_in_force_gc": "false"} and counted > (
            before["majorCompactionCounter"] + before["minorCompactionCounter"]
        ):
            return dict(details[0])
        time.sleep(0.05)
    raise AssertionError("the forced garbage collection round never ended")


def test_forced_rounds_suspension_and_bad_input() -> None:
    with LocalCluster(1) as local:
        base = f"http://127.0.0.1:{local.bookies[0].http_port}/api/v1/bookie"
        bookie_id = local.bookie_ids[0]
        assert call(base, "/gc") == (200, {"is_in_force_gc": "false"})
        status, details = call(base, "/gc_details")
        assert status == 200 and len(details) == 1
        first = details[0]
        assert list(first) == [
            "forceCompacting", "majorCompacting", "minorCompacting", "lastMajorCompactionTime",
            "lastMinorCompactionTime", "lastEntryLocationCompactionTime",
            "majorCompactionCounter", "minorCompactionCounter", "entryLocationCompactionCounter",
        ]  # fmt: skip
        assert first["majorCompactionCounter"] == first["lastMajorCompactionTime"] == 0

        # A forced round (no body): a major compaction, nothing suspended.
        assert call(base, "/gc", "PUT") == (200, f"Triggered GC on BookieServer: {bookie_id}")
        after = details_after_round(base, first)
        assert after["majorCompactionCounter"] == 1
        assert after["lastMajorCompactionTime"] >= int(time.time() * 1000) - 60_000

        # Major suspended: a forced round without names runs a minor compaction only.
        assert call(base, "/gc/suspend_compaction") == (
            200,
            {"isMinorGcSuspended": "false", "isMajorGcSuspended": "false"},
        )
        status, said = call(base, "/gc/suspend_compaction", "PUT", b'{"suspendMajor": true}')
        assert status == 200 and said.startswith("Suspend majorGC on BookieServer: ")
        assert bookie_id in said
        assert call(base, "/gc/suspend_compaction")[1]["isMajorGcSuspended"] == "true"
        call(base, "/gc", "PUT")
        after_minor = details_after_round(base, after)
        assert after_minor["majorCompactionCounter"] == 1
        assert after_minor["minorCompactionCounter"] == 1

        # Named, a suspended kind runs.
        call(base, "/gc", "PUT", b'{"forceMajor": "TRUE", "forceMinor": false}')
        named = details_after_round(base, after_minor)
        assert named["majorCompactionCounter"] == 2

        # Bad input: 400, one line, nothing changed; other methods 405.
        suspended = call(base, "/gc/suspend_compaction")[1]
        for path, method, body, wanted in (
            ("/gc", "PUT", b"not json", "expected no body or a JSON object"),
            ("/gc", "PUT", b"[1]", "expected no body or a JSON object"),
            ("/gc/suspend_compaction", "PUT", b"", "Empty request body"),
            ("/gc/suspend_compaction", "PUT", b"{}", "No suspendMajor or suspendMinor params"),
            ("/gc/suspend_compaction", "PUT", b'{"suspendMinor": "true"}', "must be true or"),
            ("/gc/resume_compaction", "PUT", b'{"other": 1}', "No resumeMajor or resumeMinor"),
        ):
            status, text = call(base, path, method, body)
            assert status == 400 and wanted in text and "\n" not in text, (path, body, text)
        for path, method in (
            ("/gc", "POST"),
            ("/gc_details", "PUT"),
            ("/gc/resume_compaction", "GET"),
        ):
            assert call(base, path, method)[0] == 405, path
        assert call(base, "/gc/suspend_compaction")[1] == suspended
        assert call(base, "/gc_details")[1][0]["majorCompactionCounter"] == 2

        status, said = call(
            base, "/gc/resume_compaction", "PUT", b'{"resumeMajor": true, "resumeMinor": false}'
        )
        assert status == 200 and said.startswith("Resume majorGC on BookieServer: ")
        assert call(base, "/gc/suspend_compaction")[1] == {
            "isMinorGcSuspended": "false",
            "isMajorGcSuspended": "false",
        }
