"""The bodies one `serve` session holds between their arrival and the commit that lists them.

Every body a client sends (ahead of its manifest, answering a `need`, in a version 1 `files`, or
joined from a tail) is verified against its sha256 by the session, then admitted here: one over
the file limit is refused at once, as are bodies answering one exchange past the namespace
quota, and bodies sent ahead count against `ahead_bytes`. An admitted body is redacted and kept;
once the kept ones add up to STORE_AHEAD_BYTES they are stored as they are (`Store.put_blobs`,
claimed for the session until it ends), so the session holds no more text than that. A commit
takes what it lists (`incoming`), stored or not; those bodies leave the pool after the next
message that reads it (`listed`, `settle`).
"""

from __future__ import annotations

from sharedmem.hashing import sha256_bytes
from sharedmem.protocol import AHEAD_REFS, PeerError
from sharedmem.rules import MIB

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from sharedmem.rules import Limits
    from sharedmem.server.ingest import IncomingFile
    from sharedmem.server.store import Store

# Bodies are stored in batches of about this much as they come. What is left under it waits
# for the namespace's commit, after the client's last byte: smaller batches cost a first sync
# more commits, larger ones leave more to write while the client waits.
STORE_AHEAD_BYTES = 1 * MIB
REF_BYTES = 32
NO_REF = bytes(REF_BYTES)  # a text sent ahead that was not UTF-8: nothing to refer to


class BodyPool:
    """Verified, redacted bodies of one session, by the sha256 the client gave them.

    `pool`: sha256 -> (text in UTF-8, redactions, size, sha256 as stored), size and address
    those of the redacted text; the text is None once stored. `refused`: bodies refused as they
    came, as (reason, size), none of their text.
    """

    def __init__(self, store: Store, limits: Limits) -> None:
        self.store = store
        self.limits = limits
        self.pool: dict[str, tuple[bytes | None, dict[str, int], int, str]] = {}
        self.refused: dict[str, tuple[str, int]] = {}
        self.unstored: list[tuple[str, int, bytes]] = []
        self.unstored_keys: list[str] = []  # the client's sha256 of each row of `unstored`
        self.unstored_bytes = 0
        self.ahead_bytes = 0  # bytes of bodies and tails sent ahead in this session
        self.budget = 0  # bytes one exchange may still send (answering need, or version 1)
        # The bodies the last commit listed, which leave the pool (`settle`) before the next
        # message that reads it: not before a pull, which the client waits for.
        self.to_release: set[str] | None = None
        # Version 3: the sha256 (raw) of each text sent ahead, in order, so a manifest entry may
        # name its body by its place here (protocol.AHEAD_REFS); NO_REF for one not UTF-8.
        self.refs = bytearray()

    def __contains__(self, sha: object) -> bool:
        """Whether the session already decided on this body: kept, or refused."""
        return sha in self.pool or sha in self.refused

    def lacking(self, shas: set[str]) -> set[str]:
        """Those of `shas` the session holds no decision on: the store may have them."""
        return shas - self.pool.keys() - self.refused.keys()

    def held(self, shas: Iterable[str]) -> list[str]:
        """Those of `shas` the pool keeps (the client sent them in this session)."""
        return [sha for sha in shas if sha in self.pool]

    def exchange(self) -> None:
        """A namespace exchange starts: it may send up to the namespace quota in bodies."""
        self.budget = self.limits.namespace_bytes

    def count_ahead(self, size: int) -> None:
        """Count bytes of bodies or tails sent ahead; past `ahead_bytes` the session ends."""
        self.ahead_bytes += size
        if self.ahead_bytes > self.limits.namespace_bytes:
            raise PeerError("ahead-full", "the client sent more than "
                            f"{self.limits.namespace_bytes} bytes of bodies and tails ahead of "
                            "a manifest (hello.ahead_bytes); send the rest when the server "
                            "names them in need")

    def refer(self, sha: str | None) -> None:
        """Version 3: remember the next text sent ahead, which a manifest may name by its place."""
        if len(self.refs) < AHEAD_REFS * REF_BYTES:
            self.refs += NO_REF if sha is None else bytes.fromhex(sha)

    def admit(self, sha: str, data: bytes, *, ahead: bool) -> bool:
        """Whether to keep a verified body; a refused one is remembered, none of its text.

        A body over the file limit is refused as `too-large` at once, so it is never stored.
        Bodies ahead are bounded by `ahead_bytes` (`count_ahead`); the others by the
        exchange's namespace quota (`budget`), past which each is refused as `quota`: more
        than that could not all be stored in one namespace anyway.
        """
        size = len(data)
        if size > self.limits.file_bytes:
            self.refused[sha] = ("too-large", size)
            return False
        if not ahead:
            self.budget -= size
            if self.budget < 0:
                self.refused[sha] = ("quota", size)
                return False
        return True

    def keep(self, fresh: dict[str, bytes]) -> None:
        """Redact admitted bodies (valid UTF-8) in one pass; store them once they add up.

        The redactor gets the bytes alone and decodes only the texts its screen touches: the
        others are stored as the bytes that came, never made into a str.
        """
        if not fresh:
            return
        from sharedmem.redact.redactor import redact_many
        for (sha, data), (clean, counts) in zip(
                fresh.items(), redact_many(None, list(fresh.values())), strict=True):
            address = sha
            if counts:  # stored as redacted, under the address of what is stored
                assert clean is not None
                data = clean.encode("utf-8")
                address = sha256_bytes(data)
            self.pool[sha] = (data, counts, len(data), address)
            self.unstored.append((address, len(data), data))
            self.unstored_keys.append(sha)
            self.unstored_bytes += len(data)
        if self.unstored_bytes >= STORE_AHEAD_BYTES:
            # Stored now, while the client still walks or sends, not in the commit it waits
            # for, and not held. A few bodies (a small re-sync's) are left to that commit: a
            # transaction of their own would cost it more than it saves.
            rows, keys = self.unstored, self.unstored_keys
            self.unstored, self.unstored_keys, self.unstored_bytes = [], [], 0
            self.store.put_blobs(rows)
            for sha in keys:
                _, counts, size, address = self.pool[sha]
                self.pool[sha] = (None, counts, size, address)

    def incoming(self, entries: Iterable[tuple[str, str, int, int]]) -> list[IncomingFile]:
        """The listed files with what this session holds of each body: text, stored, or refused.

        Each made as a plain tuple of all its fields, not through IncomingFile's keywords and
        defaults, which cost more for the thousands of files of a first sync. ingest.py is not
        loaded before the hello: the session loads it after, while the client walks.
        """
        from sharedmem.server.ingest import IncomingFile
        pool, refused = self.pool, self.refused
        make = tuple.__new__
        files = []
        for path, sha, size, mtime in entries:
            body = pool.get(sha)
            if body is not None:
                text, counts, size, address = body
                files.append(make(IncomingFile, (path, sha, size, mtime, text, counts, address,
                                                 None)))
            elif (refusal := refused.get(sha)) is not None:
                files.append(make(IncomingFile, (path, sha, refusal[1], mtime, None, None, None,
                                                 refusal[0])))
            else:
                files.append(make(IncomingFile, (path, sha, size, mtime, None, None, None, None)))
        return files

    def listed(self, shas: set[str]) -> None:
        """A commit listed these: they leave the pool at the next `settle`."""
        self.to_release = shas if self.to_release is None else self.to_release | shas

    def settle(self) -> None:
        """Forget the bodies the last commits listed: they stored what they accepted."""
        shas, self.to_release = self.to_release, None
        if not shas:
            return
        for sha in shas:
            self.pool.pop(sha, None)
        if self.refused:
            for sha in shas:
                self.refused.pop(sha, None)
        if self.unstored and not shas.isdisjoint(self.unstored_keys):
            kept = [i for i, sha in enumerate(self.unstored_keys) if sha not in shas]
            self.unstored = [self.unstored[i] for i in kept]
            self.unstored_keys = [self.unstored_keys[i] for i in kept]
            self.unstored_bytes = sum(row[1] for row in self.unstored)
