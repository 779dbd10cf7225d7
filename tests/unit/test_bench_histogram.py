"""`bookkeeper bench` folds a run's raw latencies (and a tail's lags) into its HdrHistogram by
value: the figures are those of recording every latency on its own, out-of-range ones clamped
the same way."""

from __future__ import annotations

import array
import random

from bookkeeper_py.admin import bench


def test_latencies_folded_by_value_give_the_figures_of_one_record_each() -> None:
    rng = random.Random(21)
    values = [int(rng.lognormvariate(7, 1.2)) for _ in range(20_000)]
    values += [0, -5, bench.HIGHEST_US * 3, bench.LOWEST_US, bench.HIGHEST_US]  # clamped
    progress = bench.Progress(quiet=True)
    progress.latencies_us = array.array("q", values)

    folded = progress.histogram()
    one_by_one = bench.histogram()
    for value in values:
        one_by_one.record_value(min(max(value, bench.LOWEST_US), bench.HIGHEST_US))

    assert folded.get_total_count() == len(values)
    assert bench.summary(folded) == bench.summary(one_by_one)
    assert bench.summary(bench.folded(values)) == bench.summary(one_by_one)  # the tail's lags
    for quantile in (0.0, 10.0, 50.0, 90.0, 99.0, 99.9, 100.0):
        assert folded.get_value_at_percentile(quantile) == one_by_one.get_value_at_percentile(
            quantile
        )
