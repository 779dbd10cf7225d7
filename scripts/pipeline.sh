#!/usr/bin/env bash
# The main job on a fresh Debian machine with Python 3.11: installs what it needs (a Java 17
# runtime from the OS packages when there is none, the package with its spark extra in .venv),
# then runs a local 3-bookie cluster on the embedded metadata store with the Spark pipeline on
# it: an application appends events to a log, a Structured Streaming job aggregates them into
# another log (exactly once) and into Parquet, and every micro-batch is printed; it keeps
# serving until Ctrl-C. Extra arguments go to `bookkeeper localbookie` (e.g. --exit-after-demo).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v java >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[spark]'
exec .venv/bin/bookkeeper localbookie 3 --pipeline "$@"
