"""The namespaces a server holds, as both ends read them: one row each, the notes apart.

The server lists them in its `pull`, `export` and `status` answers: its machines' namespaces
in key order, then the notes folder as one more row. On the wire that is one list; here the
notes row is a field of its own, so no code finds it by its place in the list.
"""

from __future__ import annotations

from collections import namedtuple

from sharedmem.rules import NOTES_DIR

TYPE_CHECKING = False  # typing costs `serve` milliseconds before it can answer
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any


# Named tuples made by `collections.namedtuple`, not `typing.NamedTuple`: `serve` loads this
# module before its hello, and typing with its NamedTuple classes cost it about 8 ms there.
class Namespace(namedtuple("Namespace", "key machine source kind generation created_generation "
                           "synced_at files bytes digest", defaults=(0, None, 0, 0, ""))):
    """One namespace as the server lists it; the fields in the order they go on the wire.

    key, machine (None for the notes), source, kind, generation (int), created_generation
    (int), synced_at (str or None), files and bytes (int), digest (str).
    """

    __slots__ = ()

    def to_row(self) -> dict[str, Any]:
        """The JSON object a server sends for it."""
        return self._asdict()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Namespace:
        """Read a server's row; only key, source, kind and generation must be there.

        A client reads no more than those and machine and synced_at, so a server that sends
        fewer of the others (an older one, or a test's stand-in) is read all the same.
        """
        return cls(str(row["key"]), row.get("machine"), str(row["source"]), str(row["kind"]),
                   int(row["generation"]), row.get("created_generation", 0),
                   row.get("synced_at"), row.get("files", 0), row.get("bytes", 0),
                   row.get("digest", ""))


class NamespaceList(namedtuple("NamespaceList", "machines notes")):
    """Every namespace a server holds: its machines' namespaces, and the notes namespace.

    machines: list[Namespace]; notes: Namespace, or None only when a server left it out.
    """

    __slots__ = ()

    def every(self) -> list[Namespace]:
        """The machines' namespaces, then the notes namespace: the order of the wire list."""
        return self.machines if self.notes is None else [*self.machines, self.notes]

    def to_rows(self) -> list[dict[str, Any]]:
        """The list a server sends."""
        return [ns.to_row() for ns in self.every()]

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> NamespaceList:
        """Read a server's list; the notes namespace is the row with its key, wherever it is."""
        machines: list[Namespace] = []
        notes = None
        for row in rows:
            ns = Namespace.from_row(row)
            if ns.key == NOTES_DIR:
                notes = ns
            else:
                machines.append(ns)
        return cls(machines, notes)
