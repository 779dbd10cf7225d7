#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian machine with Python 3.11 (Java, a real
# ZooKeeper server and the Java BookKeeper kit's libraries from the OS packages, headless Chromium
# and chromedriver for the dashboard's browser tests, valgrind for a benchmark's smoke test, the package with its test extras and PySpark
# in .venv), then runs the linters and the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# Java, a real ZooKeeper and Apache BookKeeper 4.14.8 (Java) for the interop tests, all from the
# OS packages through the kit's own set-up (idempotent).
kit="${BOOKKEEPER_JAVA_KIT:-../shared/java-bookkeeper}"
if [ ! -f "$kit/setup.sh" ]; then
    echo "error: the Java BookKeeper kit is not at $kit; put ../shared beside this repository or set BOOKKEEPER_JAVA_KIT" >&2
    exit 1
fi
bash "$kit/setup.sh"

# Headless Chromium and its driver from the OS packages, for the dashboard's browser tests, and
# valgrind, with which bench/add_path.py counts instructions (idempotent: nothing is done when
# all are installed).
if ! dpkg -s chromium chromium-driver valgrind >/dev/null 2>&1; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver valgrind >/dev/null
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test,bench,spark]'

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
