"""A new user's first steps in fresh virtual environments that also hold Apache BookKeeper's own
Python package (``apache-bookkeeper-client``, which owns the ``bookkeeper`` namespace through a
``.pth`` file), installed before and after this project: the README's commands and its Python
snippets, taken from README.md itself, work as written."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bookkeeper_py.testing.waiting import interrupt

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PLACEHOLDER = re.compile(r"sqlite:////tmp/bk-cluster-[^\"\s]*")
APACHE = "apache-bookkeeper-client"


def run(*command: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"{command}: {result.stdout[-2000:]}{result.stderr[-3000:]}"
    return result


def python_snippets() -> list[str]:
    snippets = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
    assert len(snippets) >= 2 and all(PLACEHOLDER.search(s) for s in snippets), snippets
    return snippets


def start_demo(venv: Path) -> tuple[subprocess.Popen[str], str]:
    """The README's first command: ``bookkeeper localbookie 3 --demo``; its metadata URI once
    the demo is done and the cluster serves."""
    process = subprocess.Popen(
        [str(venv / "bin" / "bookkeeper"), "localbookie", "3", "--demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    uri, demo_lines = "", 0
    deadline = time.monotonic() + 180
    for line in process.stdout:  # ends if the process exits
        uri = line.split(": ", 1)[1].strip() if line.startswith("metadata service URI") else uri
        demo_lines += "every byte matches" in line
        if line.startswith("cluster is up") or time.monotonic() > deadline:
            break
    if not uri or demo_lines < 4 or process.poll() is not None:
        process.kill()
        _, err = process.communicate(timeout=30)
        pytest.fail(
            f"localbookie --demo did not come up ({demo_lines} demo ledgers): {err[-3000:]}"
        )
    return process, uri


@pytest.mark.slow
@pytest.mark.parametrize("apache_first", [True, False], ids=["apache-first", "project-first"])
def test_readme_in_a_fresh_environment_beside_apache_bookkeeper_client(
    tmp_path: Path, apache_first: bool
) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    pip = venv / "bin" / "pip"
    installs = [[APACHE], ["-e", str(ROOT)]]
    for install in installs if apache_first else installs[::-1]:
        run(pip, "install", "-q", *install)
    python = venv / "bin" / "python"

    # Both packages live side by side: Apache's `bookkeeper`, ours `bookkeeper_py`.
    where = run(
        python,
        "-c",
        "import bookkeeper, bookkeeper_py; from bookkeeper_py import BookKeeper; "
        "print(list(bookkeeper.__path__)[0]); print(bookkeeper_py.__file__)",
    ).stdout.splitlines()
    assert where[0] == str(
        venv
        / "lib"
        / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        / "site-packages"
        / "bookkeeper"
    )
    assert where[1] == str(ROOT / "src" / "bookkeeper_py" / "__init__.py")

    process, uri = start_demo(venv)
    try:
        bookkeeper = venv / "bin" / "bookkeeper"
        out = run(bookkeeper, "shell", "simpletest", "--metadata-uri", uri, "-n", "1000").stdout
        assert "wrote 1000 entries" in out and "read and verified them" in out
        bookies = run(bookkeeper, "shell", "listbookies", "--metadata-uri", uri).stdout.split()
        assert len(bookies) == 3
        ledgers = run(bookkeeper, "shell", "listledgers", "--metadata-uri", uri).stdout.split()
        assert len(ledgers) == 5  # 4 demo ledgers and simpletest's
        out = run(
            bookkeeper, "shell", "ledgermetadata", "-l", ledgers[0], "--metadata-uri", uri
        ).stdout
        assert f"ledger {ledgers[0]}" in out and "state: CLOSED" in out

        blocking, asyncio_snippet = python_snippets()[:2]
        out = run(python, "-c", PLACEHOLDER.sub(uri, blocking)).stdout.splitlines()
        assert out[0] == "acked: 1000"  # every async add acknowledged before the close
        read = [int(line.split(" ", 1)[0]) for line in out[1:]]
        assert read == list(range(1001))  # b"hello" and the 1,000 adds, read back
        out = run(python, "-c", PLACEHOLDER.sub(uri, asyncio_snippet)).stdout
        assert out.strip() == "1000 entries added, 1000 read back"
    finally:
        _, err = interrupt(process)  # Ctrl-C, as the README says
    assert process.returncode == 0, err[-3000:]
