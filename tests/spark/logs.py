"""Writing the logs the Spark tests read, through the blocking log API."""

from __future__ import annotations

from collections.abc import Iterable

from bookkeeper_py import BookKeeper
from bookkeeper_py.log import LogConfig
from bookkeeper_py.log.facade import LogNamespace


def write_log(
    uri: str,
    key: str,
    payloads: Iterable[bytes],
    *,
    roll_every: int = 0,
    config: LogConfig | None = None,
    batch_bytes: int = 256 * 1024,
) -> None:
    """Appends ``payloads`` to log ``namespace/log`` (made if missing), rolling every
    ``roll_every`` records, and closes the writer."""
    namespace, _, name = key.partition("/")
    with BookKeeper(uri) as client:
        logs = LogNamespace(client, namespace)
        logs.create()
        if name not in logs.list_logs():
            logs.create_log(name, config or LogConfig())
        with logs.open_writer(name, batch_bytes=batch_bytes) as writer:
            for count, payload in enumerate(payloads, 1):
                writer.append(payload)
                if roll_every and count % roll_every == 0:
                    writer.flush()
                    writer.roll()
            writer.flush()
