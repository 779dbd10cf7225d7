"""The two exposition styles of ``PrometheusMetrics``: histograms (ours) and BookKeeper's
(summaries in ms with quantiles over the last finished window, counters without _total)."""

from __future__ import annotations

import math
import re
from functools import partial

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bookkeeper_py.prometheus import PrometheusMetrics


def lines(metrics: PrometheusMetrics) -> list[str]:
    return metrics.render().decode().splitlines()


def value(rendered: list[str], sample: str) -> float:
    [line] = [line for line in rendered if line.startswith(sample + " ")]
    return float(line.rsplit(" ", 1)[1])


def test_bookkeeper_style_summaries_counters_and_gauges() -> None:
    metrics = PrometheusMetrics("bookkeeper", rollover_s=3600)
    stats = metrics.op_stats(
        "bookkeeper_server_ADD_ENTRY_REQUEST", "adds", aliases=("bookkeeper_server_ADD_ENTRY",)
    )
    counter = metrics.counter("bookie_WRITE_BYTES", "bytes")
    metrics.gauge_function("bookie_SERVER_STATUS", "status", lambda: 1.0)
    latencies_ms = [0.2 * (number + 1) for number in range(1000)]  # 0.2 ms .. 200 ms
    for ms in latencies_ms:
        stats.success(ms / 1000)
    stats.failure(0.004)
    counter.inc(1024)
    first = lines(metrics)
    # the first window is not finished: no quantile yet, counts and sums already
    assert value(
        first, 'bookkeeper_server_ADD_ENTRY_REQUEST{success="true",quantile="0.99"}'
    ) != value(first, 'bookkeeper_server_ADD_ENTRY_REQUEST{success="true",quantile="0.99"}')  # NaN
    assert value(first, 'bookkeeper_server_ADD_ENTRY_REQUEST_count{success="true"}') == 1000
    assert value(first, 'bookkeeper_server_ADD_ENTRY_REQUEST_sum{success="true"}') == pytest.approx(
        sum(latencies_ms)
    )
    assert (
        "# TYPE bookie_WRITE_BYTES counter" in first and value(first, "bookie_WRITE_BYTES") == 1024
    )
    assert not any(line.startswith("bookie_WRITE_BYTES_total") for line in first)
    assert (
        "# TYPE bookie_SERVER_STATUS gauge" in first and value(first, "bookie_SERVER_STATUS") == 1
    )
    assert any(line.startswith("process_cpu_seconds_total") for line in first)

    metrics.rollover_s = 0  # the window ends at this scrape
    rolled = lines(metrics)
    for name in ("bookkeeper_server_ADD_ENTRY_REQUEST", "bookkeeper_server_ADD_ENTRY"):
        assert f"# TYPE {name} summary" in rolled
        for quantile, exact in (
            (0.5, 100.0),
            (0.75, 150.0),
            (0.95, 190.0),
            (0.99, 198.0),
            (0.999, 199.8),
        ):
            got = value(rolled, f'{name}{{success="true",quantile="{quantile}"}}')
            assert got == pytest.approx(exact, rel=0.02), (quantile, got)
        assert value(rolled, f'{name}{{success="true",quantile="1.0"}}') == pytest.approx(200.0)
        assert value(rolled, f'{name}{{success="false",quantile="0.5"}}') == pytest.approx(
            4.0, rel=0.02
        )
    # success="false" first, as BookKeeper writes them
    block = [line for line in rolled if line.startswith("bookkeeper_server_ADD_ENTRY_REQUEST{")]
    assert block[0].startswith(
        'bookkeeper_server_ADD_ENTRY_REQUEST{success="false",quantile="0.5"}'
    )
    assert [re.search(r'quantile="([^"]+)"', line).group(1) for line in block[:7]] == [  # type: ignore[union-attr]
        "0.5", "0.75", "0.95", "0.99", "0.999", "0.9999", "1.0",
    ]  # fmt: skip
    empty = lines(metrics)  # a window without events
    assert math.isnan(
        value(empty, 'bookkeeper_server_ADD_ENTRY_REQUEST{success="true",quantile="0.5"}')
    )


def test_histograms_style_and_bad_style() -> None:
    metrics = PrometheusMetrics()
    stats = metrics.op_stats("bookie_journal_JOURNAL_SYNC", "syncs", aliases=("other_NAME",))
    metrics.counter("bookie_READ_BYTES", "bytes").inc(5)
    stats.success(0.0003)
    rendered = lines(metrics)
    assert value(rendered, 'bookie_journal_JOURNAL_SYNC_bucket{le="0.0005",success="true"}') == 1
    assert value(rendered, 'other_NAME_count{success="true"}') == 1
    assert value(rendered, "bookie_READ_BYTES_total") == 5
    with pytest.raises(ValueError, match="histograms, bookkeeper"):
        PrometheusMetrics("summaries")


@pytest.mark.parametrize("style", ["histograms", "bookkeeper"])
def test_labelled_series_of_one_name_form_one_metric(style: str) -> None:
    """Series registered under one name with other label values (a journal each, a ledger
    directory each) are one metric: one TYPE line, a sample per series, parsed back as such."""

    metrics = PrometheusMetrics(style, rollover_s=0)
    journals = [
        metrics.op_stats("bookie_journal_JOURNAL_SYNC", "syncs", labels={"journalIndex": str(i)})
        for i in range(2)
    ]
    journals[0].success(0.001)
    journals[1].successes(0.002, 3)  # a group of three records
    odd = 'C:\\data "x"\nnew'  # escaped in the text format
    for directory, count in (("/d0", 4.0), (odd, 7.0)):
        metrics.gauge_function(
            "bookie_ledgers_count", "ledgers", partial(float, count), {"ledgerDir": directory}
        )
    metrics.counter("bookie_WRITE_BYTES", "bytes").inc(5)
    text = metrics.render().decode()
    assert text.count("# TYPE bookie_ledgers_count gauge") == 1
    assert text.count("# TYPE bookie_journal_JOURNAL_SYNC ") == 1
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples[("bookie_ledgers_count", (("ledgerDir", "/d0"),))] == 4
    assert samples[("bookie_ledgers_count", (("ledgerDir", odd),))] == 7
    for index, count, total_s in ((0, 1, 0.001), (1, 3, 0.006)):
        labels = (("journalIndex", str(index)), ("success", "true"))
        assert samples[("bookie_journal_JOURNAL_SYNC_count", labels)] == count
        scale = 1000.0 if style == "bookkeeper" else 1.0  # ms there, s here
        assert samples[("bookie_journal_JOURNAL_SYNC_sum", labels)] == pytest.approx(
            total_s * scale
        )
    if style == "bookkeeper":
        p50 = (("journalIndex", "1"), ("quantile", "0.5"), ("success", "true"))
        assert samples[("bookie_journal_JOURNAL_SYNC", p50)] == pytest.approx(2.0, rel=0.02)


def test_a_series_registered_twice_or_with_other_label_names_is_refused() -> None:
    metrics = PrometheusMetrics()
    metrics.gauge_function("bookie_ledgers_count", "ledgers", lambda: 1.0, {"ledgerDir": "/a"})
    with pytest.raises(ValueError, match=r"bookie_ledgers_count \{'ledgerDir': '/a'\} is regist"):
        metrics.gauge_function("bookie_ledgers_count", "ledgers", lambda: 2.0, {"ledgerDir": "/a"})
    with pytest.raises(ValueError, match="already a gauge labelled \\['ledgerDir'\\]"):
        metrics.gauge_function("bookie_ledgers_count", "ledgers", lambda: 2.0)
    with pytest.raises(ValueError, match="cannot also be a counter"):
        metrics.counter("bookie_ledgers_count", "ledgers", {"ledgerDir": "/b"})


@pytest.mark.parametrize("style", ["histograms", "bookkeeper"])
def test_render_of_named_families_alone(style: str) -> None:
    """``/metrics?name[]=...``: only the families asked for, whole; a name that is not there
    gives nothing, not an error; none asked for gives every family."""
    metrics = PrometheusMetrics(style, rollover_s=3600)
    sync = metrics.op_stats("bookie_journal_JOURNAL_SYNC", "syncs", labels={"journalIndex": "0"})
    add = metrics.op_stats("bookkeeper_server_ADD_ENTRY_REQUEST", "adds")
    metrics.counter("bookie_WRITE_BYTES", "bytes").inc(10)
    sync.success(0.001)
    add.success(0.002)

    def families(*names: str) -> set[str]:
        text = metrics.render(names).decode()
        return {family.name for family in text_string_to_metric_families(text)}

    assert families("bookie_journal_JOURNAL_SYNC") == {"bookie_journal_JOURNAL_SYNC"}
    both = families("bookie_journal_JOURNAL_SYNC", "bookie_WRITE_BYTES", "no_such_metric")
    assert both == {"bookie_journal_JOURNAL_SYNC", "bookie_WRITE_BYTES"}
    assert families("process_cpu_seconds") == {"process_cpu_seconds"}
    assert families("no_such_metric") == set()
    assert {
        "bookie_journal_JOURNAL_SYNC",
        "bookkeeper_server_ADD_ENTRY_REQUEST",
        "bookie_WRITE_BYTES",
        "process_cpu_seconds",
    } <= families()
    text = metrics.render(["bookie_journal_JOURNAL_SYNC"]).decode()
    counts = [line for line in text.splitlines() if "_count{" in line]
    assert counts and all(line.startswith("bookie_journal_JOURNAL_SYNC_count") for line in counts)
