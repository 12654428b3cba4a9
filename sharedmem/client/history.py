"""`history` and `show` from a client: the versions the server keeps of one published file.

One short session that asks and returns the answer (protocol version 2's `history` and `show`
messages, docs/PROTOCOL.md). Read-only: nothing is published, and the cache is neither read
nor written. The path is checked here first, and again by the server.
"""

from __future__ import annotations

import re
from typing import Any

from sharedmem.cache.layout import published_path_problems
from sharedmem.client.config import ClientConfig
from sharedmem.client.transport import Connection
from sharedmem.core import PathRuleError, ProtocolError
from sharedmem.hashing import sha256_text
from sharedmem.protocol import PeerError


def history(config: ClientConfig, path: str) -> dict[str, Any]:
    """The versions the server keeps of `path`, oldest first, the current one last."""
    reply = _ask(config, {"type": "history", "path": path}, "history")
    versions = reply.get("versions")
    if (type(reply.get("retention_days")) is not int or not isinstance(versions, list)
            or not all(_sound(item) for item in versions)):
        raise ProtocolError(f"the server's history of {path!r} is not a list of versions as "
                            "docs/PROTOCOL.md describes them: upgrade the server with "
                            "install_server.py")
    return {**reply, "path": path}


_SHA256 = re.compile(r"[0-9a-f]{64}")
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")


def _sound(item: object) -> bool:
    """A version as the protocol has it, with nothing in it a terminal would act on.

    Numbers, a sha256, and a time unless it is the current one.
    """
    if not isinstance(item, dict):
        return False
    when = item.get("replaced_at")
    return (type(item.get("version")) is int and type(item.get("size")) is int
            and isinstance(item.get("sha256"), str) and bool(_SHA256.fullmatch(item["sha256"]))
            and isinstance(item.get("current"), bool)
            and (when is None or isinstance(when, str) and bool(_TIME.fullmatch(when))))


def show(config: ClientConfig, path: str, version: int) -> dict[str, Any]:
    """One version of `path` with its text, checked against its sha256."""
    reply = _ask(config, {"type": "show", "path": path, "version": version}, "version")
    text = reply.get("text")
    if not isinstance(text, str) or sha256_text(text) != reply.get("sha256"):
        raise ProtocolError(f"the server's text of {path!r} version {version} does not match "
                            "its sha256: nothing was written; run `doctor` on the server")
    return {**reply, "path": path}


def _ask(config: ClientConfig, message: dict[str, Any], answer: str) -> dict[str, Any]:
    """Send one request after hello and read its answer; the server's refusal as our error."""
    problems = published_path_problems(message["path"])
    if problems:
        raise PathRuleError(f"{'; '.join(problems)}: name the file as `list` shows it, "
                            "machines/<machine>/<source>/<file>.md")
    with Connection(config) as conn:
        hello = conn.hello()
        if conn.version < 2:
            raise ProtocolError(f"{conn.where} speaks only protocol version 1 "
                                f"({hello.get('server')}), which has no file history: upgrade "
                                "the server with install_server.py")
        try:
            conn.channel.send(message)
            reply = conn.channel.expect(answer)
        except PeerError as exc:
            if exc.code == "unknown-type":
                raise ProtocolError(f"{conn.where} runs {hello.get('server')}, which keeps no "
                                    "file history: upgrade the server with install_server.py"
                                    ) from None
            raise
    return {key: value for key, value in reply.items() if key != "type"}
