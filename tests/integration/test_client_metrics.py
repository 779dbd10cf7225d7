"""The client's metrics (``ClientConfig.metrics``) in BookKeeper's names: adds, reads and ledger
operations timed by outcome, ensemble changes, pending adds; nothing recorded without them."""

from __future__ import annotations

import pytest

from bookkeeper_py import BookKeeper, errors
from bookkeeper_py.prometheus import PrometheusMetrics
from bookkeeper_py.testing import LocalCluster


def value(metrics: PrometheusMetrics, sample: str) -> float:
    rendered = metrics.render().decode().splitlines()
    [line] = [line for line in rendered if line.startswith(sample + " ")]
    return float(line.rsplit(" ", 1)[1])


def test_client_metrics_in_bookkeepers_names() -> None:
    metrics = PrometheusMetrics("bookkeeper", rollover_s=3600)
    with LocalCluster(3) as local, BookKeeper(local.metadata_uri, metrics=metrics) as client:
        handle = client.create_ledger(2, 2, 2)
        for number in range(20):
            handle.add_entry(b"entry %d" % number)
        assert value(metrics, 'bookkeeper_client_ADD_ENTRY_count{success="true"}') == 20
        assert value(metrics, "bookkeeper_client_NUM_PENDING_ADD") == 0
        assert value(metrics, "bookkeeper_client_NUM_ENSEMBLE_CHANGE") == 0
        first = client.get_ledger_metadata(handle.ledger_id).ensembles[0][1]
        local.stop_bookie(local.bookie_ids.index(first[0]))  # the writer replaces it
        for number in range(20, 30):
            handle.add_entry(b"entry %d" % number)
        assert value(metrics, "bookkeeper_client_NUM_ENSEMBLE_CHANGE") >= 1
        handle.close()
        assert value(metrics, "bookkeeper_client_NUM_ENSEMBLE_CHANGE") >= 1  # kept after close
        reader = client.open_ledger(handle.ledger_id)
        assert len(reader.read_entries(0, 29)) == 30
        client.delete_ledger(handle.ledger_id)
        assert value(metrics, 'bookkeeper_client_ADD_ENTRY_count{success="true"}') == 30
        assert value(metrics, 'bookkeeper_client_READ_ENTRY_count{success="true"}') == 1
        for operation in ("CREATE", "OPEN", "DELETE"):
            assert (
                value(metrics, f'bookkeeper_client_LEDGER_{operation}_count{{success="true"}}') == 1
            )
        assert value(metrics, 'bookkeeper_client_LEDGER_RECOVER_count{success="true"}') == 0
        assert value(metrics, "bookkeeper_client_SPECULATIVE_READ_COUNT") >= 0
        # a ledger that is not there: a failed open
        with pytest.raises(errors.NoSuchLedgerError):
            client.open_ledger(999_999)
        assert value(metrics, 'bookkeeper_client_LEDGER_OPEN_count{success="false"}') == 1
