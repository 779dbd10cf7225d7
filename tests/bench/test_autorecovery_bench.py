"""bench/autorecovery_bench.py keeps working: each mode runs once at a tiny scale. (It measures
speed; this only checks that it runs to the end and reports its figures. No timing is
asserted.)"""

from __future__ import annotations

import json

import pytest

from .test_bench_smoke import run

FIGURES = {
    "rereplicate": [
        "mb_per_s",
        "copied_mb",
        "kill_to_vanish_s",
        "kill_to_first_mark_s",
        "bookies_cpu_s_per_mb",
        "baseline_p50_ms",
        "during_p99_ms",
        "p50_slowdown_percent",
        "others_cpu_percent",
    ],
    "mark": ["kill_to_vanish_s", "vanish_to_first_mark_s", "over_delay_from_kill_s"],
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "options"),
    [
        (
            "rereplicate",
            ["--scale", "0.01", "--warmup", "0.2", "--baseline", "0.5", "--writer-rate", "200"],
        ),
        ("mark", ["--mark-ledgers", "3", "--delays", "0", "--victims", "other"]),
    ],
)
def test_autorecovery_benchmark_runs(mode: str, options: list[str]) -> None:
    out = run("autorecovery_bench.py", mode, "--runs", "1", "--json", *options)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["mode"] == mode and report["targets"]
    medians = report["median"]
    for figures in medians.values() if mode == "mark" else [medians]:
        assert set(FIGURES[mode]) <= set(figures)
    if mode == "rereplicate":
        # every copy the victim held was made again and sampled copies read back
        assert medians["ledgers"] == 10 and medians["verified_copies"] > 0
        assert medians["copied_mb"] > 0
    else:
        assert set(medians) == {"delay 0 s, other"}
