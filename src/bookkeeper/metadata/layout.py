"""Where ledgers live in the metadata tree (reference section 1.8).

* ``flat``: ``<root>/L%010d``
* ``hierarchical`` (default): ids below 2^31-1 as 2-4-4 (``<root>/00/0000/L0001``), larger ids as
  the long 3-4-4-4-4 form (``<root>/000/0000/0000/0000/L0001``)
* ``longhierarchical``: always the long form
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

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


def iter_ledger_ids(root: str, layout: str, children: Callable[[str], list[str]]) -> Iterator[int]:
    """Every ledger id under ``root`` in increasing order, walking one directory at a time."""
    top = children(root)
    if layout == "flat":
        yield from sorted(
            int(name[1:]) for name in top if name.startswith("L") and name[1:].isdigit()
        )
        return
    for depth_name_length, levels in ((2, 2), (3, 4)):
        if layout == "longhierarchical" and depth_name_length == 2:
            continue
        for first in sorted(n for n in top if n.isdigit() and len(n) == depth_name_length):
            yield from _walk(f"{root}/{first}", first, levels - 1, children)


def _walk(
    path: str, digits: str, levels_left: int, children: Callable[[str], list[str]]
) -> Iterator[int]:
    names = children(path)
    if levels_left == 0:
        for name in sorted(
            n for n in names if n.startswith("L") and n[1:].isdigit() and len(n) == 5
        ):
            yield int(digits + name[1:])
        return
    for name in sorted(n for n in names if n.isdigit() and len(n) == 4):
        yield from _walk(f"{path}/{name}", digits + name, levels_left - 1, children)
