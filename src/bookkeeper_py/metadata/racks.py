"""Where the bookies are (their racks), kept in the metadata store as Apache Pulsar keeps them.

One node beside the ledgers' root, ``bookies`` (``/bookies`` when the ledgers are at
``/ledgers``: the path Pulsar's ``BookieRackAffinityMapping`` reads and ``pulsar-admin bookies
set-bookie-rack`` writes), holding JSON: groups of bookies, each bookie id with its rack and,
optionally, its host name::

    {"default": {"10.0.0.1:3181": {"rack": "/rack-a", "hostname": "bookie-1"}}}

A rack is ``/rack`` or ``/region/rack`` (``placement.NetworkTopology``). Read by the client's
rack- and region-aware placement when it is given no mapping of its own, by the dashboard, and
by ``shell bookierack``, which changes it with the one compare-and-swap loop (``cas_update``).
A bookie in several groups is placed by the first group that names it, ``default`` first.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

from bookkeeper_py.core.placement import NetworkTopology
from bookkeeper_py.errors import IncorrectParameterError, MetadataStoreError
from bookkeeper_py.metadata.driver import BadVersionError, NodeExistsError, NoNodeError
from bookkeeper_py.metadata.port import MetadataPort, cas_update

DEFAULT_GROUP = "default"
MAX_RACKS_BYTES = 1 << 20  # a racks node larger than this is refused as malformed

Racks = dict[str, dict[str, dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Placement:
    """One bookie's place, as the racks node says."""

    bookie_id: str
    rack: str
    group: str = DEFAULT_GROUP
    hostname: str | None = None


def racks_path(port: MetadataPort) -> str:
    """The racks node: ``bookies`` beside the ledgers' root."""
    parent = posixpath.dirname(port.ledgers_root.rstrip("/")) or "/"
    return posixpath.join(parent, "bookies")


def check_rack(rack: str) -> str:
    """``rack`` if it is ``/rack`` or ``/region/rack``; else ``ValueError`` saying so."""
    if not rack.startswith("/"):
        raise ValueError(f"rack {rack!r}: write /rack or /region/rack")
    try:
        NetworkTopology({"check": rack})
    except IncorrectParameterError as error:  # it names the form expected
        raise ValueError(str(error)) from None
    return rack


def parse(data: bytes, path: str) -> Racks:
    """The groups of a racks node; ``MetadataStoreError`` naming the node when it is not the
    JSON expected (nothing of it is used then)."""
    if not data.strip():
        return {}
    try:
        found = json.loads(data)
    except ValueError as error:
        raise MetadataStoreError(
            f"the racks node {path} is not JSON ({error}); fix or delete it"
        ) from None
    ok = isinstance(found, dict) and all(
        isinstance(group, dict)
        and all(
            isinstance(place, dict) and isinstance(place.get("rack"), str)
            for place in group.values()
        )
        for group in found.values()
    )
    if not ok:
        raise MetadataStoreError(
            f'the racks node {path} is not {{"group": {{"bookie id": {{"rack": "/rack"}}}}}}; '
            "fix or delete it"
        )
    groups: Racks = found
    return groups


def placements(racks: Racks) -> dict[str, Placement]:
    """Each bookie's place: the first group naming it, ``default`` first."""
    found: dict[str, Placement] = {}
    groups = sorted(racks, key=lambda name: (name != DEFAULT_GROUP, name))
    for group in groups:
        for bookie_id, place in racks[group].items():
            hostname = place.get("hostname")
            found.setdefault(
                bookie_id,
                Placement(
                    bookie_id, place["rack"], group, hostname if isinstance(hostname, str) else None
                ),
            )
    return found


async def read(port: MetadataPort) -> tuple[Racks, int]:
    """The racks node's groups and version (``{}`` and -1 when there is none)."""
    path = racks_path(port)
    try:
        data, version = await port.get_node(path)
    except NoNodeError:
        return {}, -1
    if len(data) > MAX_RACKS_BYTES:
        raise MetadataStoreError(f"the racks node {path} holds {len(data)} bytes; fix or delete it")
    return parse(data, path), version


async def read_placements(port: MetadataPort) -> dict[str, Placement]:
    """Each bookie the racks node places."""
    return placements((await read(port))[0])


async def _write(port: MetadataPort, racks: Racks, version: int) -> int:
    path = racks_path(port)
    data = json.dumps(racks, indent=2, sort_keys=True).encode()
    if version < 0:
        try:
            return await port.create_node(path, data)
        except NodeExistsError:
            raise BadVersionError(path) from None  # created meanwhile: read it again
    return await port.set_node(path, data, version)


async def set_rack(
    port: MetadataPort,
    bookie_id: str,
    rack: str,
    *,
    group: str = DEFAULT_GROUP,
    hostname: str | None = None,
) -> Placement:
    """Places ``bookie_id`` in ``rack`` (in ``group``; removed from the others)."""
    check_rack(rack)
    place: dict[str, Any] = {"rack": rack}
    if hostname:
        place["hostname"] = hostname

    def transform(racks: Racks) -> Racks:
        updated = {name: dict(members) for name, members in racks.items()}
        for members in updated.values():
            members.pop(bookie_id, None)
        updated.setdefault(group, {})[bookie_id] = place
        return {name: members for name, members in updated.items() if members}

    await cas_update(
        f"the racks node {racks_path(port)}",
        lambda: read(port),
        lambda racks, version: _write(port, racks, version),
        lambda racks: racks.get(group, {}).get(bookie_id) != place,
        transform,
    )
    return Placement(bookie_id, rack, group, hostname or None)


async def delete_rack(port: MetadataPort, bookie_id: str) -> bool:
    """Forgets ``bookie_id``'s rack; False if the racks node did not place it."""
    forgotten = False

    def transform(racks: Racks) -> Racks:
        nonlocal forgotten
        forgotten = True
        updated = {
            name: {b: p for b, p in members.items() if b != bookie_id}
            for name, members in racks.items()
        }
        return {name: members for name, members in updated.items() if members}

    await cas_update(
        f"the racks node {racks_path(port)}",
        lambda: read(port),
        lambda racks, version: _write(port, racks, version),
        lambda racks: any(bookie_id in members for members in racks.values()),
        transform,
    )
    return forgotten
