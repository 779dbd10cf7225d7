"""Where ledgers live in the metadata tree (reference section 1.8).

* ``flat``: ``<root>/L%010d``
* ``hierarchical`` (default): ids below 2^31-1 as 2-4-4 (``<root>/00/0000/L0001``), larger ids as
  the long 3-4-4-4-4 form (``<root>/000/0000/0000/0000/L0001``)
* ``longhierarchical``: always the long form
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

SHORT_ID_LIMIT = 2**31 - 1  # Integer.MAX_VALUE


def _short_path(ledger_id: int) -> str:
    digits = f"{ledger_id:010d}"
    return f"{digits[0:2]}/{digits[2:6]}/L{digits[6:10]}"


def _long_path(ledger_id: int) -> str:
    digits = f"{ledger_id:019d}"
    return f"{digits[0:3]}/{digits[3:7]}/{digits[7:11]}/{digits[11:15]}/L{digits[15:19]}"


def ledger_path(root: str, layout: str, ledger_id: int) -> str:
    """The znode path holding ``ledger_id``'s metadata."""
    if ledger_id < 0:
        raise ValueError(f"ledger ids are not negative: {ledger_id}")
    if layout == "flat":
        return f"{root}/L{ledger_id:010d}"
    if layout == "hierarchical" and ledger_id < SHORT_ID_LIMIT:
        return f"{root}/{_short_path(ledger_id)}"
    return f"{root}/{_long_path(ledger_id)}"


def iter_ledger_ids(
    root: str, layout: str, children: Callable[[str], Iterable[str]], after: int = -1
) -> Iterator[int]:
    """Every ledger id above ``after`` under ``root`` in increasing order, walking one
    directory at a time.

    ``children(path)`` yields a directory's names in increasing order (a store's paged
    listing), so memory stays bounded by a page whatever the number of ledgers: ids are
    zero-padded, so names of equal length sort as their numbers. A directory whose ids are all
    ``after`` or below is not listed (a page of ledgers far into a large cluster does not walk
    the ledgers before it)."""
    if layout == "flat":
        for name in children(root):
            if name.startswith("L") and name[1:].isdigit() and int(name[1:]) > after:
                yield int(name[1:])
        return
    for depth_name_length, levels in ((2, 2), (3, 4)):
        if layout == "longhierarchical" and depth_name_length == 2:
            continue
        width = depth_name_length + 4 * levels  # the digits of an id in this tree
        for first in children(root):
            if first.isdigit() and len(first) == depth_name_length:
                if int(first.ljust(width, "9")) <= after:
                    continue
                yield from _walk(f"{root}/{first}", first, levels - 1, children, width, after)


def _walk(
    path: str,
    digits: str,
    levels_left: int,
    children: Callable[[str], Iterable[str]],
    width: int,
    after: int,
) -> Iterator[int]:
    if levels_left == 0:
        for name in children(path):
            if name.startswith("L") and name[1:].isdigit() and len(name) == 5:
                ledger_id = int(digits + name[1:])
                if ledger_id > after:
                    yield ledger_id
        return
    for name in children(path):
        if name.isdigit() and len(name) == 4:
            prefix = digits + name
            if int(prefix.ljust(width, "9")) <= after:
                continue
            yield from _walk(f"{path}/{name}", prefix, levels_left - 1, children, width, after)
