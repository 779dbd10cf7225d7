"""The benchmark scripts keep working: each runs for a moment with tiny parameters. (They
measure speed; these tests only check that they run to the end. No timing is asserted.)"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

BENCH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"
)


def run(script: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, os.path.join(BENCH, script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_cluster_benchmark_runs() -> None:
    """bench/cluster.py: every row has its figure, and every row measured by `bookkeeper bench`
    the CPU per entry of the client and of each bookie."""
    import json

    out = run(
        "cluster.py",
        *("--runs", "1", "--seconds", "0.5", "--recovery-entries", "1000"),
        *("--read-entries", "2000", "--stall-seconds", "0.3", "--settle-seconds", "2", "--json"),
    )
    report = json.loads(out.strip().splitlines()[-1])
    # The disk settled before every cluster: the first row measured on each says how long.
    settled = {name: row["settled_s"] for name, row in report["rows"].items() if "settled_s" in row}
    assert len(settled) == 8, sorted(settled)
    assert all(wait >= 0 for waits in settled.values() for wait in waits), settled
    assert report["limits"]["fsyncs_per_s"] > 0 and len(report["rows"]) == 11
    assert report["limits"]["disk_sync_max_ms"] > 0 and report["limits"]["disk_stall_moments"] >= 0
    # The half-rate row carries what the disk alone allowed at its rate, run by run.
    (half,) = [row for name, row in report["rows"].items() if "at half that rate" in name]
    (floor,) = half["disk_alone"]
    assert floor["adds"] > 0 and floor["add_p99_ms"] >= floor["add_p50_ms"] > 0
    # ... and the ideal C cluster's figures on that schedule, as the one-add-in-flight row does.
    (one,) = [row for name, row in report["rows"].items() if "one add in flight" in name]
    for figures in (half["ideal_c_cluster"], one["ideal_c_cluster"]):
        (ideal,) = figures
        assert ideal["adds"] > 0 and ideal["p99_ms"] >= ideal["p50_ms"] > 0
        assert ideal["cpu_per_entry_us"]["client"] > 0 and ideal["cpu_per_entry_us"]["bookie"] > 0
    # After the half-rate row, the ideal C cluster spending that row's CPU per entry (the
    # client's, and the bookies' mean); and under it, how late the client issued its adds.
    (same_cpu,) = half["ideal_c_cluster_same_cpu"]
    (row_cpu,) = half["cpu_per_entry_us"]
    bookies_us = [us for process, us in row_cpu.items() if process != "client"]
    assert same_cpu["cpu_spent_per_entry_us"]["client"] == pytest.approx(row_cpu["client"])
    assert same_cpu["cpu_spent_per_entry_us"]["bookie"] == pytest.approx(
        sum(bookies_us) / len(bookies_us)
    )
    assert same_cpu["adds"] > 0 and same_cpu["p99_ms"] >= same_cpu["p50_ms"] > 0
    (delay,) = half["send_delay"]
    assert 0 < delay["p50_ms"] <= delay["p99_ms"]
    for name, row in report["rows"].items():
        assert row["median"] > 0, name
        if "recovery" not in name and row["unit"] != "x":  # x: a ratio of two rows
            (cpu,) = row["cpu_per_entry_us"]
            assert cpu["client"] > 0 and len(cpu) >= 2, name
            assert row["failures"] == [0], name  # every run's failed adds are counted


@pytest.mark.slow
def test_storage_engine_benchmark_runs() -> None:
    out = run("storage_engine.py", "--runs", "1", "--seconds", "0.05")
    assert "fsyncs/s" in out and "1024 B entries" in out


@pytest.mark.slow
def test_scale_benchmark_runs() -> None:
    out = run("scale_ledgers.py", "--ledgers", "2000", "--runs", "1", "--requests", "200")
    assert "read back and verified" in out


@pytest.mark.slow
def test_index_store_benchmark_runs() -> None:
    out = run("index_store.py", "--ledgers", "2000", "--runs", "1", "--lookups", "100")
    assert "lmdb" in out and "sqlite" in out


@pytest.mark.slow
def test_long_poll_benchmark_runs() -> None:
    assert "long-poll wake after ack" in run("long_poll.py", "--count", "20")


@pytest.mark.slow
def test_metadata_benchmark_runs() -> None:
    out = run("metadata_store.py", "--ledgers", "50", "--runs", "1", "--drivers", "memory,sqlite")
    assert "CAS update" in out and "sqlite" in out


@pytest.mark.slow
def test_tailing_lag_benchmark_runs() -> None:
    out = run("tailing_lag.py", "--rate", "500", "--seconds", "0.5", "--runs", "1")
    assert "tailing reader lag" in out and "p99" in out


ONE_BOOKIE = ["--local", "1", "-e", "1", "-w", "1", "-a", "1"]


def bench_report(*workload: str) -> dict[str, Any]:
    """``bookkeeper bench WORKLOAD --json``'s report (the command must succeed)."""
    import json

    result = subprocess.run(
        [sys.executable, "-m", "bookkeeper_py", "bench", *workload, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.slow
@pytest.mark.parametrize(
    "workload",
    [
        ["writes", "--local", "3", "--seconds", "1", "--in-flight", "50"],
        # the closed loop over several writers and ledgers each, up to a number of adds
        [
            "writes",
            *ONE_BOOKIE,
            "--entries",
            "3000",
            "--writers",
            "2",
            "--ledgers-per-writer",
            "3",
            "--in-flight",
            "40",
        ],
        [
            "writes",
            *ONE_BOOKIE,
            "--rate",
            "500",
            "--seconds",
            "1",
        ],
        # (enough entries that the bookies' CPU spans several 10 ms clock ticks: they serve these
        # reads from their write caches at ~0.2 µs an entry, and 20,000 entries once read as
        # no tick at all in every bookie)
        ["reads", "--local", "3", "--entries", "150000"],
        ["reads", "--local", "3", "--tail", "--rate", "1000", "--seconds", "1"],
    ],
)
def test_the_bench_command_runs(workload: list[str]) -> None:
    report = bench_report(*workload)
    assert report["entries"] > 0 and report["failures"] == 0
    if "--entries" in workload:  # every add issued was answered and counted, no more
        assert report["entries"] == int(workload[workload.index("--entries") + 1])
    assert {"p50_ms", "p99_ms", "p99.9_ms", "max_ms"} <= set(report["latency"])
    # CPU per entry of the client and of each bookie started for the run (and the reader). The
    # kernel counts a process's CPU in clock ticks (10 ms): a bookie that served a third of a
    # short read run can show 0 (CI saw it), the bookies of a run of seconds together cannot.
    cpu = report["cpu_per_entry_us"]
    bookies = int(workload[workload.index("--local") + 1])
    expected = 1 + bookies + ("--tail" in workload)
    assert len(cpu) == expected and cpu.pop("client") > 0
    assert all(us >= 0 for us in cpu.values()) and sum(cpu.values()) > 0
    # The bookies' own metrics over the window: every bookie answered both scrapes; adds (and
    # the journal syncs that made them durable) were seen wherever the run wrote in it.
    figures = report["bookies"]
    assert figures["bookies_measured"] == bookies
    if workload[0] == "writes" or "--tail" in workload:
        assert figures["add_p99_ms"] > 0 and figures["journal_syncs_per_s"] > 0
        assert 0 < figures["add_mean_ms"] <= figures["add_p99_ms"] * 10
        assert figures["journal_sync_p99_ms"] > 0 and figures["journal_sync_mean_ms"] > 0
        # syncs of 25 ms and more (the disk's stalls) are counted, none or some
        assert figures["journal_stalls_per_bookie"] >= 0
    # An open-loop writer says how late it issued its adds: part of each add's latency, so no
    # quantile of it exceeds the latency's; a closed loop has no due times.
    delay = report["send_delay"]
    if workload[0] == "writes" and "--rate" in workload:
        assert {"p50_ms", "p99_ms", "max_ms"} <= set(delay)
        assert 0 < delay["p50_ms"] <= delay["p99_ms"] <= delay["max_ms"]
        for quantile in ("p50_ms", "p99_ms", "max_ms"):
            assert delay[quantile] <= report["latency"][quantile]
    else:
        assert delay == {}


@pytest.mark.slow
def test_an_open_loop_measures_every_add_due_in_its_window() -> None:
    """``bench writes --rate``: each writer's adds fall due on its schedule and go to its
    ledgers in turn; every add due from the warm-up's end to the run's end is measured once
    (an answer finds its add's due time from the ledger and entry id), with its latency from
    that due time, and how late it was issued."""
    workload = [*ONE_BOOKIE, "--rate", "3000", "--seconds", "1", "--warmup", "0.5"]
    report = bench_report("writes", *workload, "--writers", "2", "--ledgers-per-writer", "3")
    assert report["failures"] == 0
    assert abs(report["entries"] - 3000) <= 2  # one add either side of each writer's window
    assert 0 < report["send_delay"]["p50_ms"] <= report["latency"]["p50_ms"]


LOG_BENCH_FIGURES = {
    "append": ["records_per_s", "mb_per_s", "client_cpu_us_per_record", "rolls"],
    "tail": [
        "from_ack_p50_ms",
        "from_ack_p99_ms",
        "p50_ms",
        "p99_ms",
        "p99.9_ms",
        "max_ms",
        "appended_per_s",
        "kept_rate",
    ],
    "catchup": ["records_per_s", "client_cpu_us_per_record", "bookies_cpu_us_per_record"],
    "recovery": ["seconds", "open_segments_before", "recovered_segments"],
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "options"),
    [
        ("append", ["--seconds", "0.3", "--sizes", "100,1024"]),
        ("tail", ["--rate", "2000", "--warmup", "0.2", "--tail-seconds", "0.5"]),
        ("catchup", ["--records", "5000"]),
        ("recovery", ["--segment-records", "500"]),
    ],
)
def test_log_benchmark_runs(mode: str, options: list[str]) -> None:
    import json

    out = run("log_bench.py", mode, "--runs", "1", "--json", *options)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["mode"] == mode and len(report["targets"]) >= 1
    medians = report["median"]
    for figures in medians.values() if mode == "append" else [medians]:
        assert set(LOG_BENCH_FIGURES[mode]) <= set(figures)
    if mode == "append":
        assert set(medians) == {"100", "1024"} and medians["100"]["records"] > 0
    if mode == "tail":
        assert medians["measured_records"] > 0 and medians["gaps"] == 0
        assert 0 <= medians["from_ack_p50_ms"] <= medians["p50_ms"]  # acked after appended
    if mode == "recovery":
        assert medians["open_segments_before"] == 2 == medians["recovered_segments"]


SPARK_BENCH_FIGURES = {
    "read": ["records_per_s", "partitions", "client_cpu_us_per_record", "jvm_cpu_us_per_record"],
    "stream": ["p50_ms", "p99_ms", "max_ms", "appended_per_s", "kept_rate", "missing"],
    "write": ["records_per_s", "client_cpu_us_per_record", "bookies_cpu_us_per_record"],
}


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize(
    ("mode", "options"),
    [
        ("read", ["--records", "20000"]),
        ("stream", ["--rate", "1000", "--warmup", "1", "--window", "1", "--tail-s", "0.5"]),
        ("write", ["--records", "20000", "--warmup-records", "100"]),
    ],
)
def test_spark_benchmark_runs(mode: str, options: list[str]) -> None:
    import json

    out = run("spark_bench.py", mode, "--runs", "1", "--json", *options)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["mode"] == mode and len(report["targets"]) == 1
    medians = report["median"]
    assert set(SPARK_BENCH_FIGURES[mode]) <= set(medians)
    if mode == "stream":
        assert medians["measured_records"] > 0
        assert medians["missing"] == 0 and medians["duplicates"] == 0
    else:
        assert medians["records"] == 20000


def test_disk_stall_probe_runs() -> None:
    """bench/disk_stalls.py: every journal-like writer reports its syncs, and the stall moments
    are listed (none is asserted: they are the disk's)."""
    import json

    out = run("disk_stalls.py", "--seconds", "0.3", "--bulk-mb-s", "10", "--json")
    report = json.loads(out.strip().splitlines()[-1])
    assert len(report["journals"]) == 3
    for figures in report["journals"]:
        assert figures["syncs"] > 0 and figures["max_ms"] >= figures["p50_ms"] > 0
    assert isinstance(report["stall_moments"], list)


def test_commit_floor_runs() -> None:
    """bench/commit_floor.py: every add due is counted, and its latency is at least one sync."""
    import json

    out = run("commit_floor.py", "--rate", "2000", "--seconds", "0.3", "--json")
    report = json.loads(out.strip().splitlines()[-1])
    assert report["adds"] == 600 and report["syncs_per_s"] > 0
    assert report["add_max_ms"] >= report["add_p99_ms"] >= report["add_p50_ms"] > 0
    assert report["add_p50_ms"] >= report["sync_p50_ms"] * 0.5


@pytest.mark.parametrize("schedule", [["--rate", "3000"], ["--in-flight", "4"]])
def test_ideal_cluster_runs(schedule: list[str]) -> None:
    """bench/ideal_cluster.py: the C cluster builds, every add measured is acknowledged by two
    bookies (the client waits for both), open loop and closed."""
    import json

    out = run("ideal_cluster.py", *schedule, "--seconds", "0.4", "--warmup", "0.1", "--json")
    (result,) = json.loads(out.strip().splitlines()[-1])
    if schedule[0] == "--rate":
        # the adds due after the warm-up (the one due at its very end either side of it)
        assert abs(result["adds"] - (int(3000 * 0.5) - int(3000 * 0.1))) <= 1
    else:
        assert result["adds"] > 0 and result["in_flight"] == 4
    assert result["max_ms"] >= result["p99_ms"] >= result["p50_ms"] > 0
    assert result["cpu_per_entry_us"]["client"] > 0


@pytest.mark.parametrize("entry_logs", [True, False])
def test_ideal_cluster_writes_its_entry_logs(entry_logs: bool) -> None:
    """bench/ideal_cluster.py: each bookie writes the entries it stores a second time, to its
    entry log, a megabyte at a time (all but the last partial megabyte); with
    ``--no-entry-logs``, nothing."""
    import json

    options = [] if entry_logs else ["--no-entry-logs"]
    out = run(
        "ideal_cluster.py",
        *("--rate", "1500", "--seconds", "0.4", "--warmup", "0.1", "--entry-size", "65536"),
        *options,
        "--json",
    )
    (result,) = json.loads(out.strip().splitlines()[-1])
    assert result["entry_logs"] is entry_logs
    # two bookies of three store each add: ~500 adds of 64 KiB each, ~32 MiB
    for logged, stored in zip(result["entry_log_bytes"], result["stored_bytes"], strict=True):
        assert stored >= 400 * 65536
        if entry_logs:
            assert logged % (1 << 20) == 0 and stored - (1 << 20) < logged <= stored
        else:
            assert logged == 0


@pytest.mark.parametrize("schedule", [["--rate", "3000"], ["--in-flight", "4"]])
def test_ideal_cluster_spends_the_cpu_asked_for(schedule: list[str]) -> None:
    """bench/ideal_cluster.py --cpu-per-entry: the client and each bookie spend at least the
    CPU per add asked for (a bookie's figure is per add of the run, as bench's), and every add
    is still acknowledged by two bookies (the bookies' syncing threads answer them)."""
    import json

    out = run(
        "ideal_cluster.py",
        *schedule,
        "--seconds",
        "0.4",
        "--warmup",
        "0.1",
        "--cpu-per-entry",
        "150",
        "120",
        "--json",
    )
    (result,) = json.loads(out.strip().splitlines()[-1])
    if schedule[0] == "--rate":
        assert abs(result["adds"] - (int(3000 * 0.5) - int(3000 * 0.1))) <= 1
    else:
        assert result["adds"] > 0
    assert result["max_ms"] >= result["p99_ms"] >= result["p50_ms"] > 0
    # (without spending, these processes take 25-35 µs an add here)
    assert result["cpu_spent_per_entry_us"] == {"client": 150.0, "bookie": 120.0}
    # the client spends half at each send and half at each answer: all of it by the last one;
    # a bookie stores two adds of three, each copy costing 3/2 of its per-add figure
    assert result["cpu_per_entry_us"]["client"] >= 150 * 0.95
    assert result["cpu_per_entry_us"]["bookie"] >= 120 * 0.95


def test_journal_writes_runs(tmp_path: str) -> None:
    """bench/journal_writes.py: each way of writing a journal's groups measured (on the disk
    under this checkout: tmpfs may refuse O_DIRECT)."""
    import json

    here = os.path.dirname(os.path.abspath(__file__))
    out = run("journal_writes.py", "--groups", "20", "--rounds", "1", "--directory", here, "--json")
    results = json.loads(out.strip().splitlines()[-1])
    assert [result["mode"] for result in results] == ["buffered", "direct", "direct-dsync"]
    for result in results:
        assert result["groups"] == 20 and result["cpu_us"] >= result["system_us"] >= 0
        assert result["max_ms"] >= result["p99_ms"] >= result["p50_ms"] > 0


def refused(script: str, *args: str) -> str:
    """The one-line complaint of ``script`` about a wrong flag (exit status 2, argparse's)."""
    result = subprocess.run(
        [sys.executable, os.path.join(BENCH, script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    return result.stderr


def test_ideal_cluster_refuses_a_wrong_schedule() -> None:
    assert "either --rate" in refused("ideal_cluster.py", "--rate", "10", "--in-flight", "1")
    assert "--cpu-per-entry" in refused(
        "ideal_cluster.py", "--rate", "10", "--cpu-per-entry", "-1", "2"
    )


def test_commit_floor_stripes_entries_as_a_ledger_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entry i has copies on journals i mod E to i + Qw - 1 mod E, and the count of a journal's
    entries in a span is the count of those."""
    import importlib.util

    monkeypatch.syspath_prepend(BENCH)
    spec = importlib.util.spec_from_file_location(
        "commit_floor", os.path.join(BENCH, "commit_floor.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert [j for j in range(3) if module.served(j, 3, 2, 4)] == [1, 2]
    assert [j for j in range(3) if module.served(j, 3, 2, 5)] == [0, 2]
    assert [j for j in range(5) if module.served(j, 5, 3, 3)] == [0, 3, 4]
    for journals, quorum in ((3, 2), (3, 3), (5, 3), (1, 1)):
        for journal in range(journals):
            for first in range(0, 12):
                for last in range(first - 1, 20):
                    expected = sum(
                        module.served(journal, journals, quorum, i) for i in range(first, last + 1)
                    )
                    got = module.served_between(journal, journals, quorum, first, last)
                    assert got == expected, (journal, journals, quorum, first, last)


def test_disk_stall_probe_refuses_a_wrong_flag() -> None:
    assert "must be positive" in refused("disk_stalls.py", "--journals", "0")


def test_disk_stall_moments_are_those_every_journal_shares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stall moment is a span in which every journal was inside a sync over the threshold."""
    import importlib.util

    monkeypatch.syspath_prepend(BENCH)  # its neighbours, as when run as a script
    spec = importlib.util.spec_from_file_location(
        "disk_stalls", os.path.join(BENCH, "disk_stalls.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fast = [(0.0, 0.001), (0.5, 0.001)]
    # Journals 0 and 1 stall over 1.00-1.05 and 1.02-1.10: at once over 1.02-1.05; journal 1's
    # stall at 2.0 meets none in journal 0.
    per_journal = [[*fast, (1.0, 0.05)], [*fast, (1.02, 0.08), (2.0, 0.1)]]
    (moment,) = module.stall_moments(per_journal, 0.02)
    assert abs(moment["at_s"] - 1.02) < 1e-9 and abs(moment["ms"] - 30.0) < 1e-6
    assert module.stall_moments([[*fast, (1.0, 0.05)], fast], 0.02) == []
    # Two stalls of journal 1 within one long stall of journal 0: two moments, not the span
    # from the first one's start to the second one's end.
    two = module.stall_moments([[(1.0, 0.2)], [(1.02, 0.03), (1.1, 0.05)]], 0.02)
    assert [(round(m["at_s"], 6), round(m["ms"], 6)) for m in two] == [(1.02, 30.0), (1.1, 50.0)]


def test_add_path_benchmark_runs() -> None:
    """bench/add_path.py: every batch answered (it checks the answers' bytes itself), a time
    for hot and cold caches, and the calls counted, the package's among them."""
    import json

    out = run(
        "add_path.py", "--adds", "200", "--runs", "1", "--batch", "1", "--batch", "4", "--json"
    )
    results = json.loads(out.strip().splitlines()[-1])
    assert [result["batch"] for result in results] == [1, 4]
    for result in results:
        assert result["hot_us_per_batch"] > 0 and result["cold_us_per_batch"] > 0
        assert result["calls_per_batch"] > result["our_calls_per_batch"] > 0


def test_add_path_benchmark_counts_instructions() -> None:
    """bench/add_path.py --instructions: two runs under valgrind, and a count per batch of a
    size an add path has (tens of thousands to a few million instructions)."""
    import json

    out = run(
        "add_path.py",
        *("--adds", "100", "--runs", "1", "--batch", "1", "--batch", "20"),
        *("--instructions", "50", "--json"),
    )
    one, twenty = json.loads(out.strip().splitlines()[-1])
    assert 10_000 < one["instructions_per_batch"] < 5_000_000, one
    # A batch of 20 goes to the syncer thread (more than an idle journal syncs on the loop):
    # the loop waits for it in its poll, so the count grows by what the entries cost (a few
    # thousand instructions each here), not by the passes of a loop spinning meanwhile.
    extra = twenty["instructions_per_batch"] - one["instructions_per_batch"]
    assert 0 < extra < 19 * 20_000, (one, twenty)


def test_add_path_benchmark_refuses_a_wrong_flag() -> None:
    assert "--batch, --adds and --runs must be at least 1" in refused("add_path.py", "--batch", "0")
    assert "--instructions must be at least 0" in refused("add_path.py", "--instructions", "-1")
