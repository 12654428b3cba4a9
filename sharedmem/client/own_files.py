"""What a sync published that its cache takes from its own snapshot, not from the server.

A sync holds the text of every file it read, and knows what it published. So the pull need
not send those back: the pull names the namespaces the run published (`offered`, each with
the digest sent), the server leaves out each it now holds at that digest, and the cache takes
them from the run's own snapshot. A namespace the cache does not have yet is taken whole; in
protocol version 3 one the cache has is taken too (`changed`): only the files the cache lacks,
and the paths it holds that the snapshot lost are removed. The texts read (`texts`) also stand
for any the server sends as null (the pull's `have` in version 2; in version 3 the server
knows what the session sent it).

One value, computed once when the pull is asked for, and handed to whoever needs it: the pull
request, the intake, and the publisher that loads a text for a `need`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from sharedmem.cache.update import CacheUpdate
from sharedmem.client.publication import Publication
from sharedmem.sources.walk import Entry


class OwnFiles:
    """This run's own files, as its pull and its cache's intake see them."""

    def __init__(self, texts: dict[str, str] | None = None,
                 offered: dict[str, str] | None = None,
                 entries: dict[str, list[Entry]] | None = None,
                 changed: Collection[str] = frozenset(),
                 gone: dict[str, list[str]] | None = None) -> None:
        self.texts = {} if texts is None else texts  # sha256 -> text, of each file read or sent
        self.offered = {} if offered is None else offered  # namespace -> digest sent
        self.entries = {} if entries is None else entries  # namespace -> the files to take
        self.changed = frozenset(changed)  # of `offered`, those the cache has
        self.gone = {} if gone is None else gone  # namespace (in `changed`) -> paths it loses

    @classmethod
    def of(cls, publications: Iterable[Publication], update: CacheUpdate,
           version: int) -> OwnFiles:
        """What the publications offer the pull, given what the cache holds (checked already).

        A namespace the cache lacks is offered when every file's text was read (a record
        left from an earlier cache has texts unread). In version 3 one the cache holds intact
        is offered too if it changed: when the cache holds it at the digest the last sync's
        manifest was acknowledged at, its files are as acknowledged and only those read are
        looked up; otherwise each file must be read now or in the cache at its sha256.
        """
        published = [p for p in publications if p.ok]
        texts = {e.sha256: e.text for p in published for e in p.files if e.text is not None}
        offered: dict[str, str] = {}
        entries: dict[str, list[Entry]] = {}
        changed: set[str] = set()
        gone: dict[str, list[str]] = {}
        for p in published:
            key, prefix = p.key, p.key + "/"
            if key not in update.known:
                if p.all_read:
                    offered[key], entries[key] = p.digest, p.files
                continue
            if version < 3 or not update.known[key] or not p.changed:  # 0: damaged in the cache
                continue
            if p.delta is not None and update.digests.get(key) == p.saved.acked:
                read = [e for e in p.files if e.text is not None]
                cached = update.sha256s([prefix + e.path for e in read])
                entries[key] = [e for e in read if cached.get(prefix + e.path) != e.sha256]
                gone[key] = [prefix + path for path in p.removed]
            else:
                held = update.held(key)
                if not all(e.text is not None or held.get(prefix + e.path) == e.sha256
                           for e in p.files):
                    continue
                entries[key] = [e for e in p.files if held.get(prefix + e.path) != e.sha256]
                listed = {prefix + e.path for e in p.files}
                gone[key] = [path for path in held if path not in listed]
            offered[key] = p.digest
            changed.add(key)
        return cls(texts, offered, entries, changed, gone)

    def add_text(self, sha: str, text: str) -> None:
        """A text loaded to answer a `need`: the server sends null for it in the pull."""
        self.texts[sha] = text

    def whole(self, keys: Collection[str]) -> set[str]:
        """Those of `keys` taken whole: the namespaces the cache did not have."""
        return {key for key in keys if key in self.offered and key not in self.changed}

    def files(self, keys: Collection[str]) -> list[tuple[str, str, str]]:
        """The files of those namespaces as this run sent them: (cache path, sha256, text)."""
        return [(f"{key}/{e.path}", e.sha256, e.text) for key, files in self.entries.items()
                if key in keys for e in files if e.text is not None]

    def removed(self, keys: Collection[str]) -> list[str]:
        """The cache paths those namespaces no longer hold (of a namespace in `changed`)."""
        return [path for key, paths in self.gone.items() if key in keys for path in paths]
