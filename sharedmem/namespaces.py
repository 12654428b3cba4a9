"""The namespaces a server holds, as both ends read them: one row each, the notes apart.

The server lists them in its `pull`, `export` and `status` answers: its machines' namespaces
in key order, then the notes folder as one more row. On the wire that is one list; here the
notes row is a field of its own, so no code finds it by its place in the list.
"""

from __future__ import annotations

from collections import namedtuple

from sharedmem.core import ProtocolError
from sharedmem.rules import NOTES_DIR

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


# Named tuples made by `collections.namedtuple`, not `typing.NamedTuple`: `serve` loads this
# module before its hello, and typing with its NamedTuple classes costs milliseconds there.
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
    def from_row(cls, row: object) -> Namespace:
        """Read a server's row, checking each field it holds is of its kind: the one reader.

        key, source and kind must be strings and generation an integer from 0; machine and
        synced_at are a string or null, and the rest, when there, of their kind. A server that
        sends fewer of the others (an older one, or a test's stand-in) is read all the same.
        ProtocolError names what is wrong.
        """
        if type(row) is not dict:
            raise ProtocolError(f"a namespaces row is not an object: {type(row).__name__}")
        for name, kinds, needed in _FIELDS:
            if name in row:
                value = row[name]
                if type(value) not in kinds or (type(value) is int and value < 0):
                    raise ProtocolError(f"namespaces row {str(row.get('key'))[:200]!r}: {name} "
                                        f"must be {_KIND_NAMES[kinds]}, not {value!r:.80}")
            elif needed:
                raise ProtocolError(f"namespaces row {str(row.get('key'))[:200]!r} has no {name}")
        return cls(row["key"], row.get("machine"), row["source"], row["kind"],
                   row["generation"], row.get("created_generation", 0), row.get("synced_at"),
                   row.get("files", 0), row.get("bytes", 0), row.get("digest", ""))


_STR, _INT, _STR_OR_NULL = (str,), (int,), (str, type(None))
_KIND_NAMES = {_STR: "a string", _INT: "an integer from 0", _STR_OR_NULL: "a string or null"}
_FIELDS = (("key", _STR, True), ("source", _STR, True), ("kind", _STR, True),
           ("generation", _INT, True), ("machine", _STR_OR_NULL, False),
           ("synced_at", _STR_OR_NULL, False), ("created_generation", _INT, False),
           ("files", _INT, False), ("bytes", _INT, False), ("digest", _STR_OR_NULL, False))


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
    def from_rows(cls, rows: object) -> NamespaceList:
        """Read a server's list; the notes namespace is the row with its key, wherever it is.

        ProtocolError when it is not a list, or a row is not read (`Namespace.from_row`).
        """
        if type(rows) is not list:
            raise ProtocolError(f"namespaces must be a list of rows, not {type(rows).__name__}")
        machines: list[Namespace] = []
        notes = None
        for row in rows:
            ns = Namespace.from_row(row)
            if ns.key == NOTES_DIR:
                notes = ns
            else:
                machines.append(ns)
        return cls(machines, notes)
