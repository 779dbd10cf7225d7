"""The options of the ``bookkeeper`` Spark data source, parsed and checked once, at planning.

Spark hands a data source its options as a case-insensitive map of strings (keys lowercased);
everything here turns them into typed values and refuses what it cannot use with one line that
names the option and what it accepts (``OptionError``), so a typo fails when the query is
planned, not in a task. Nothing here imports PySpark: the same parsing serves the pipeline jobs
and the tests.

The names follow Spark's Kafka source where one exists (``startingOffsets``, ``endingOffsets``,
``failOnDataLoss``, ``minPartitions``, ``maxTriggerDelay``...), with records for Kafka's offsets
(``maxRecordsPerTrigger``). An offset is a log sequence number, as a Kafka offset is: the
number of the next record to read, per log, keyed ``namespace/log``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from bookkeeper_py import errors
from bookkeeper_py.auth import SharedSecretClientAuthProvider, read_secret
from bookkeeper_py.client.config import ClientConfig
from bookkeeper_py.log.format import check_name
from bookkeeper_py.metadata.driver import parse_uri
from bookkeeper_py.tls import TlsConfig

EARLIEST = -2  # in startingOffsets JSON, as Kafka's
LATEST = -1
CLIENT_PREFIX = "client."  # client.<ClientConfig field>: passed to the client as it is


class OptionError(errors.IncorrectParameterError, ValueError):
    """An option of the ``bookkeeper`` data source cannot be used; the message names it."""


def _bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}={text!r}: use true or false")


def _int(name: str, text: str, minimum: int = 0) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f"option {name}={text!r}: use a whole number") from None
    if value < minimum:
        raise OptionError(f"option {name}={text!r}: use a number of at least {minimum}")
    return value


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|)\s*", re.IGNORECASE)
_UNIT_S = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _duration_s(name: str, text: str) -> float:
    match = _DURATION.fullmatch(text)
    if not match:
        raise OptionError(f"option {name}={text!r}: use a duration such as 500ms, 30s, 15m or 1h")
    return float(match.group(1)) * _UNIT_S[match.group(2).lower()]


def log_key(namespace: str, name: str) -> str:
    """``namespace/log`` (a log named ``ns/log`` keeps its own namespace)."""
    if "/" in name:
        space, _, log = name.partition("/")
        return f"{check_name('namespace', space)}/{check_name('log', log)}"
    return f"{check_name('namespace', namespace)}/{check_name('log', name)}"


@dataclass(frozen=True)
class Subject:
    """What to read or write: logs by name or pattern, or raw ledgers (batch reads only)."""

    logs: tuple[str, ...] = ()  # namespace/log
    pattern: re.Pattern[str] | None = None  # over namespace/log, in `namespace`
    namespace: str = "default"
    ledgers: tuple[int, ...] = ()

    @property
    def is_ledgers(self) -> bool:
        return bool(self.ledgers)


@dataclass(frozen=True)
class Offsets:
    """``earliest``, ``latest`` or per-log sequence numbers (``EARLIEST``/``LATEST`` allowed
    per log); by timestamp: ``timestamps`` per log, or one ``timestamp`` for every log (ms)."""

    kind: str  # "earliest" | "latest" | "sequences" | "timestamps"
    sequences: Mapping[str, int] = field(default_factory=dict)
    timestamps: Mapping[str, int] = field(default_factory=dict)
    timestamp: int | None = None  # one for every log


@dataclass(frozen=True)
class SourceOptions:
    uri: str
    subject: Subject
    starting: Offsets
    ending: Offsets
    fail_on_data_loss: bool = True
    include_metadata: bool = False
    min_partitions: int = 0
    max_records_per_trigger: int = 0  # 0: no limit
    max_bytes_per_trigger: int = 0
    min_records_per_trigger: int = 0
    max_trigger_delay_s: float = 15 * 60.0
    subscription: str = ""  # advanced on each streaming commit
    password: bytes = b""  # of the logs' ledgers (the namespace's) or of raw ledgers
    partition_bytes: int = 64 * 1024 * 1024  # a closed segment is split into ranges of this size
    client: Mapping[str, Any] = field(default_factory=dict)  # ClientConfig fields (picklable)


@dataclass(frozen=True)
class SinkOptions:
    uri: str
    log: str  # namespace/log
    create: bool = True  # make the log if it does not exist
    payload_column: str = ""  # "" : `payload`, else `value`
    txid_column: str = ""
    timestamp_column: str = ""
    password: bytes = b""
    ensemble: tuple[int, int, int] = (3, 2, 2)
    entry_bytes: int = 1024 * 1024
    client: Mapping[str, Any] = field(default_factory=dict)


def client_config(options: Mapping[str, Any]) -> ClientConfig:
    """The ``ClientConfig`` of the parsed client options (TLS and authentication included)."""
    values = dict(options)
    tls = values.pop("_tls", None)
    secret_file = values.pop("_auth_secret_file", None)
    principal = values.pop("_auth_name", "")
    if tls is not None:
        values["tls"] = TlsConfig(**tls)
    if secret_file:
        values["auth"] = SharedSecretClientAuthProvider(read_secret(secret_file), principal)
    return ClientConfig.of(values)


_CLIENT_FIELDS = {
    f.name: f
    for f in fields(ClientConfig)
    if f.name not in ("tls", "auth", "network_topology")  # set by their own options
}


def _client_options(options: Mapping[str, str]) -> dict[str, Any]:
    """``client.<field>`` pass-through, ``tls.*`` and ``auth.*`` (kept as plain data: the
    options travel pickled to every task)."""
    out: dict[str, Any] = {}
    for key, text in options.items():
        if not key.startswith(CLIENT_PREFIX):
            continue
        wanted = key[len(CLIENT_PREFIX) :]
        match = next((f for name, f in _CLIENT_FIELDS.items() if name.lower() == wanted), None)
        if match is None:
            raise OptionError(
                f"option {key}: not a client setting; the client settings are "
                f"{', '.join(CLIENT_PREFIX + name for name in sorted(_CLIENT_FIELDS))}"
            )
        kind = str(match.type)
        if kind == "bool":
            out[match.name] = _bool(key, text)
        elif kind == "int":
            out[match.name] = _int(key, text)
        elif kind == "float":
            try:
                out[match.name] = float(text)
            except ValueError:
                raise OptionError(f"option {key}={text!r}: use a number") from None
        else:
            out[match.name] = text
    tls: dict[str, Any] = {}
    for option, name in (
        ("tls.truststore", "trust_path"),
        ("tls.certificate", "certificate_path"),
        ("tls.key", "key_path"),
    ):
        if options.get(option):
            tls[name] = options[option]
    if options.get("tls.enabled") is not None and _bool("tls.enabled", options["tls.enabled"]):
        tls.setdefault("trust_path", None)
    if "tls.hostnameverification" in options:
        tls["hostname_verification"] = _bool(
            "tls.hostnameVerification", options["tls.hostnameverification"]
        )
    if tls:
        out["_tls"] = tls
    if options.get("auth.sharedsecretfile"):
        out["_auth_secret_file"] = options["auth.sharedsecretfile"]
        out["_auth_name"] = options.get("auth.name", "")
    try:
        client_config(out)
    except errors.BKError as error:
        raise OptionError(f"client options: {error}") from None
    return out


def parse_client_options(options: Mapping[str, str]) -> dict[str, Any]:
    """The client options among ``options`` (keys in any case, as given to the data source),
    parsed as the data source parses them: what ``audit``'s ``client_options`` takes."""
    return _client_options({key.lower(): value for key, value in options.items()})


def _uri(options: Mapping[str, str]) -> str:
    uri = options.get("metadataserviceuri", "").strip()
    if not uri:
        raise OptionError(
            "option metadataServiceUri is required: the cluster's metadata service, e.g. "
            "zk+hierarchical://127.0.0.1:2181/ledgers or sqlite:///path/metadata.db"
        )
    try:
        parse_uri(uri)
    except (ValueError, errors.BKError) as error:
        raise OptionError(f"option metadataServiceUri={uri!r}: {error}") from None
    return uri


def _subject(options: Mapping[str, str], *, allow_ledgers: bool) -> Subject:
    namespace = options.get("namespace", "default")
    try:
        check_name("namespace", namespace)
    except errors.BKError as error:
        raise OptionError(f"option namespace: {error}") from None
    if options.get("path") and not options.get("log"):  # load("ns/log") / save("ns/log")
        options = {**options, "log": options["path"]}
    given = [name for name in ("log", "logs", "logspattern", "ledgers") if options.get(name)]
    accepted = "log, logs, logsPattern" + (" or ledgers" if allow_ledgers else "")
    if len(given) != 1 or (given[0] == "ledgers" and not allow_ledgers):
        raise OptionError(
            f"name exactly one of the options {accepted} (given: {', '.join(given) or 'none'})"
        )
    kind, text = given[0], options[given[0]]
    try:
        if kind == "log":
            return Subject(logs=(log_key(namespace, text.strip()),), namespace=namespace)
        if kind == "logs":
            names = [n.strip() for n in text.split(",") if n.strip()]
            if not names:
                raise OptionError(f"option logs={text!r}: name at least one log")
            keys = tuple(dict.fromkeys(log_key(namespace, n) for n in names))
            return Subject(logs=keys, namespace=namespace)
    except errors.BKError as error:
        raise OptionError(f"option {kind}: {error}") from None
    if kind == "logspattern":
        try:
            return Subject(pattern=re.compile(text), namespace=namespace)
        except re.error as error:
            raise OptionError(
                f"option logsPattern={text!r}: not a regular expression ({error})"
            ) from None
    try:
        ledgers = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise OptionError(f"option ledgers={text!r}: use ledger ids separated by commas") from None
    if not ledgers or min(ledgers) < 0:
        raise OptionError(f"option ledgers={text!r}: use ledger ids (0 or more), comma-separated")
    return Subject(ledgers=ledgers, namespace=namespace)


def _offsets(
    options: Mapping[str, str], which: str, default: str, namespace: str, streaming: bool
) -> Offsets:
    """``startingOffsets`` / ``endingOffsets`` and their timestamp forms."""
    name = f"{which}Offsets"
    by_time = f"{which}OffsetsByTimestamp"
    one_time = f"{which}Timestamp"
    given = [n for n in (name, by_time, one_time) if options.get(n.lower())]
    if len(given) > 1:
        raise OptionError(f"give only one of the options {', '.join(given)}")
    if not given:
        return Offsets(default)
    option = given[0]
    text = options[option.lower()].strip()
    if option == one_time:
        return Offsets("timestamps", timestamp=_int(option, text))
    if option == name and text.lower() in ("earliest", "latest"):
        if which == "ending" and text.lower() == "earliest":
            raise OptionError(f"option {option}=earliest: an ending offset is latest or JSON")
        return Offsets(text.lower())
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise TypeError
        values = {log_key(namespace, str(k)): int(v) for k, v in raw.items()}
    except (ValueError, TypeError, errors.BKError):
        accepted = (
            'JSON {"namespace/log": milliseconds since the epoch, ...}'
            if option == by_time
            else '"earliest", "latest" or JSON {"namespace/log": sequence number, ...} '
            f"({EARLIEST}: earliest, {LATEST}: latest)"
        )
        raise OptionError(f"option {option}={text!r}: use {accepted}") from None
    if option == by_time:
        return Offsets("timestamps", timestamps=values)
    for key, value in values.items():
        if value < EARLIEST or (which == "ending" and value == EARLIEST):
            raise OptionError(
                f"option {option}: {key}: {value} is not a sequence number"
                + (" (-1 means latest; an ending offset cannot be earliest)" if value < 0 else "")
            )
    return Offsets("sequences", sequences=values)


def source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """The options of a read (``spark.read`` or ``spark.readStream``)."""
    options = {k.lower(): v for k, v in options.items()}
    subject = _subject(options, allow_ledgers=not streaming)
    if streaming and options.get("endingoffsets"):
        raise OptionError("option endingOffsets is for batch reads; a stream has no end")
    starting = _offsets(
        options, "starting", "latest" if streaming else "earliest", subject.namespace, streaming
    )
    ending = _offsets(options, "ending", "latest", subject.namespace, streaming)
    if subject.is_ledgers and (starting.kind != "earliest" or ending.kind != "latest"):
        raise OptionError(
            "options startingOffsets/endingOffsets are for logs; a read of ledgers reads them whole"
        )
    subscription = options.get("subscription", "")
    if subscription:
        if not streaming:
            raise OptionError("option subscription is for streaming reads (advanced on commit)")
        try:
            check_name("subscription", subscription)
        except errors.BKError as error:
            raise OptionError(f"option subscription: {error}") from None
    found = SourceOptions(
        uri=_uri(options),
        subject=subject,
        starting=starting,
        ending=ending,
        fail_on_data_loss=_bool("failOnDataLoss", options.get("failondataloss", "true")),
        include_metadata=_bool("includeMetadata", options.get("includemetadata", "false")),
        min_partitions=_int("minPartitions", options.get("minpartitions", "0")),
        max_records_per_trigger=_int(
            "maxRecordsPerTrigger", options.get("maxrecordspertrigger", "0")
        ),
        max_bytes_per_trigger=_int("maxBytesPerTrigger", options.get("maxbytespertrigger", "0")),
        min_records_per_trigger=_int(
            "minRecordsPerTrigger", options.get("minrecordspertrigger", "0")
        ),
        max_trigger_delay_s=_duration_s("maxTriggerDelay", options.get("maxtriggerdelay", "15m")),
        subscription=subscription,
        password=options.get("password", "").encode(),
        partition_bytes=_int(
            "partitionBytes", options.get("partitionbytes", str(64 * 1024 * 1024)), 1
        ),
        client=_client_options(options),
    )
    _check_known(options, SOURCE_OPTIONS)
    return found


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    """The options of a write (``df.write`` or ``df.writeStream``)."""
    options = {k.lower(): v for k, v in options.items()}
    subject = _subject(options, allow_ledgers=False)
    if len(subject.logs) != 1:
        raise OptionError("a write names one log: option log (logs and logsPattern are for reads)")
    ensemble_text = options.get("ensemble", "3,2,2")
    try:
        e, qw, qa = (int(x) for x in ensemble_text.split(","))
    except ValueError:
        raise OptionError(
            f"option ensemble={ensemble_text!r}: use ensemble,write quorum,ack quorum (3,2,2)"
        ) from None
    if not e >= qw >= qa >= 1:
        raise OptionError(f"option ensemble={ensemble_text!r}: E >= Qw >= Qa >= 1 is needed")
    found = SinkOptions(
        uri=_uri(options),
        log=subject.logs[0],
        create=_bool("createLog", options.get("createlog", "true")),
        payload_column=options.get("payloadcolumn", ""),
        txid_column=options.get("txidcolumn", ""),
        timestamp_column=options.get("timestampcolumn", ""),
        password=options.get("password", "").encode(),
        ensemble=(e, qw, qa),
        entry_bytes=_int("entryBytes", options.get("entrybytes", str(1024 * 1024)), 1024),
        client=_client_options(options),
    )
    _check_known(options, SINK_OPTIONS)
    return found


_COMMON = {
    "metadataserviceuri",
    "namespace",
    "log",
    "password",
    "tls.truststore",
    "tls.certificate",
    "tls.key",
    "tls.enabled",
    "tls.hostnameverification",
    "auth.sharedsecretfile",
    "auth.name",
    "path",  # Spark passes load(path) / save(path) as "path"
}
SOURCE_OPTIONS = _COMMON | {
    "logs",
    "logspattern",
    "ledgers",
    "startingoffsets",
    "startingoffsetsbytimestamp",
    "startingtimestamp",
    "endingoffsets",
    "endingoffsetsbytimestamp",
    "endingtimestamp",
    "failondataloss",
    "includemetadata",
    "minpartitions",
    "maxrecordspertrigger",
    "maxbytespertrigger",
    "minrecordspertrigger",
    "maxtriggerdelay",
    "subscription",
    "partitionbytes",
}
SINK_OPTIONS = _COMMON | {
    "createlog",
    "payloadcolumn",
    "txidcolumn",
    "timestampcolumn",
    "ensemble",
    "entrybytes",
    "checkpointlocation",
    "queryname",
    "writerid",
}


def _check_known(options: Mapping[str, str], known: set[str]) -> None:
    unknown = sorted(k for k in options if k not in known and not k.startswith(CLIENT_PREFIX))
    if unknown:
        raise OptionError(
            f"unknown option(s) {', '.join(unknown)}; see docs/spark.md for the options "
            f"(client settings go as {CLIENT_PREFIX}<name>)"
        )
