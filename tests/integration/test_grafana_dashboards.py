"""Stock BookKeeper Grafana dashboards read our bookies: every series their queries select
(``tests/data/grafana_bookkeeper_queries.json``: the streamnative and Apache Pulsar dashboards)
is in a bookie's ``/metrics`` in the ``bookkeeper`` style, with the label values the queries
ask for (``success="true"``, ``quantile="0.99"``...), and the latency quantiles hold numbers
once a window has passed. The few series no BookKeeper 4.18 bookie exports either are listed
with the reason. Also: the style's shape (summaries in ms, counters without ``_total``)."""

from __future__ import annotations

import json
import math
import re
import time
import urllib.request
from pathlib import Path

from bookkeeper_py import BookKeeper
from bookkeeper_py.testing import LocalCluster

QUERIES = Path(__file__).parent.parent / "data" / "grafana_bookkeeper_queries.json"
# Series a dashboard selects that BookKeeper 4.18's bookies do not export either.
NOT_EXPORTED_BY_BOOKKEEPER = {
    "bookie_journal_JOURNAL_CB_QUEUE_SIZE": "removed from BookKeeper in 4.16",
    "bookie_storage_ledgers_count": "an old name no Apache BookKeeper release exports",
    "bookie_storage_entries_count": "an old name no Apache BookKeeper release exports",
    "bookie_storage_write_cache_size": "an old name no Apache BookKeeper release exports",
    "bookie_storage_read_cache_size": "an old name no Apache BookKeeper release exports",
}
# A matcher no BookKeeper bookie answers: Java prints the maximum's quantile as "1.0".
NEVER_MATCHED = {("quantile", "1")}
MATCHER = re.compile(r'(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"')


SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")


def scrape(port: int) -> dict[str, list[dict[str, str]]]:
    """Sample name -> the label sets of its samples (values kept under "__value__"), read as
    Prometheus reads the text format (sample names as written: a counter without _total keeps
    its name)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    samples: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = SAMPLE.fullmatch(line.strip())
        assert found, line
        name, labels, value = found.groups()
        pairs = dict(
            MATCHER.findall(labels or "")[i][::2] for i in range(len(MATCHER.findall(labels or "")))
        )
        samples.setdefault(name, []).append({**pairs, "__value__": value})
    return samples


def selected(samples: dict[str, list[dict[str, str]]], name: str, matchers: list[str]) -> bool:
    """Whether a selector (metric name, label matchers) selects a sample. Matchers on the
    scrape's own labels (job, instance...) and on dashboard variables ($x) select anything."""
    wanted = []
    for matcher in matchers:
        found = MATCHER.fullmatch(matcher.strip())
        assert found, matcher
        label, operator, value = found.groups()
        if "$" in value or label in ("job", "instance", "cluster", "pod", "kubernetes_pod_name"):
            continue
        wanted.append((label, operator, value))
    for labels in samples.get(name, []):
        ok = True
        for label, operator, value in wanted:
            have = labels.get(label, "")
            if operator == "=":
                ok &= have == value
            elif operator == "!=":
                ok &= have != value
            elif operator == "=~":
                ok &= re.fullmatch(value, have) is not None
            else:
                ok &= re.fullmatch(value, have) is None
        if ok:
            return True
    return False


def test_the_stock_dashboards_find_their_series() -> None:
    queries = json.loads(QUERIES.read_text())["queries"]
    assert len(queries) >= 60
    args = ["--metrics-style", "bookkeeper", "--metrics-rollover-s", "1"]
    with LocalCluster(1, bookie_args=args) as local, BookKeeper(local.metadata_uri) as client:
        handle = client.create_ledger(1, 1, 1)
        for number in range(50):
            handle.add_entry(b"entry %d" % number)
        handle.close()
        reader = client.open_ledger(handle.ledger_id)
        assert len(reader.read_entries(0, 49)) == 50
        time.sleep(1.2)  # a window passes: the next scrape's quantiles are of it
        samples = scrape(local.bookies[0].http_port)
        missing = []
        for query in queries:
            for name in query["metrics"]:
                if name in NOT_EXPORTED_BY_BOOKKEEPER:
                    continue
                matchers = query["labels"].get(name, [])
                if any(
                    (label, value) in NEVER_MATCHED
                    for label, _, value in (
                        MATCHER.fullmatch(m.strip()).groups()  # type: ignore[union-attr]
                        for m in matchers
                    )
                ):
                    continue
                if not selected(samples, name, matchers):
                    missing.append(f"{query['source']} / {query['panel']}: {name} {matchers}")
        assert missing == [], "\n".join(missing)

        # The shape BookKeeper's provider gives: summaries in ms, counters without _total.
        def value(name: str, **labels: str) -> float:
            [found] = [s for s in samples[name] if all(s.get(k) == v for k, v in labels.items())]
            return float(found["__value__"])

        p99 = value("bookkeeper_server_ADD_ENTRY_REQUEST", success="true", quantile="0.99")
        assert 0 < p99 < 10_000 and not math.isnan(p99)  # ms
        assert value("bookkeeper_server_ADD_ENTRY_REQUEST_count", success="true") >= 50
        assert value("bookkeeper_server_ADD_ENTRY_count", success="true") >= 50
        assert value("bookie_journal_JOURNAL_ADD_ENTRY_count", success="true") >= 50
        assert value("bookie_WRITE_BYTES") > 0 and "bookie_WRITE_BYTES_total" not in samples
        assert value("bookie_SERVER_STATUS") == 1.0
        assert value("bookie_ledgers_count") >= 1
        assert "process_cpu_seconds_total" in samples
