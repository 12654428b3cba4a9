"""The client configuration, `client.json`: machine, transport, sources, cache, limits."""

from __future__ import annotations

import json
import os
from collections import namedtuple
from collections.abc import Mapping
from pathlib import Path

from sharedmem.core import ConfigError
from sharedmem.rules import KIND_MARKDOWN, SOURCE_KINDS, Limits, check_markdown_source_name, name_problem

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CONFIG_VERSION = 1
TRANSPORTS = ("local", "ssh")
COMPRESS_MODES = ("auto", "on", "off")  # auto: on over ssh to another machine
TRANSPORT_KEYS = frozenset({"kind", "store", "host", "port", "identity", "options",
                            "remote_command"})
MAX_TIMEOUT_SECONDS = 86_400  # a deadline of a day is as good as none; more is a typo
MAX_BUSY_RETRIES = 10


class SourceConfig(namedtuple("SourceConfig", "name kind path")):
    """One enabled source: its published name, its kind and the folder it reads (a Path)."""

    __slots__ = ()


class Transport(namedtuple("Transport", "kind store host port identity options remote_command",
                           defaults=(None, None, None, None, (), ()))):
    """How the client reaches `serve`: a local child process or `ssh`.

    kind (str), store (a Path, local), host (str), port (int), identity (a Path), options and
    remote_command (tuples of str); each but kind None or empty when not given.
    """

    __slots__ = ()

    @property
    def loopback(self) -> bool:
        """Whether ssh reaches this very machine: a loopback host, and no proxy on the way.

        A host is taken as written (`localhost`, `127.x.x.x`, `::1`): an alias in
        `~/.ssh/config` is not looked up, so it counts as another machine.
        """
        host = (self.host or "").rpartition("@")[2].lower()
        if not (host in ("localhost", "::1") or host.startswith("127.")):
            return False
        return not any(option.replace("=", " ").split(maxsplit=1)[0].lower()
                       in ("proxycommand", "proxyjump") for option in self.options if option.strip())


class Timeouts(namedtuple("Timeouts", "reply_seconds session_seconds session_rate busy_retries",
                          defaults=(120.0, 300.0, 4096, 4))):
    """How long a session waits on the server, and how often a busy sshd is tried again.

    reply_seconds: the longest the server may move no byte (send none, take none of what this
    side writes) while the client waits on it; above the server's own wait for its store's
    lock (60 s). session_seconds and session_rate: a session's waits on the server add up to
    at most session_seconds, and one second more for every session_rate bytes moved either
    way, so a server that trickles is stopped however steadily it trickles. busy_retries: how
    many more times an ssh connection the server resets before authentication (sshd's
    MaxStartups) is started again, after a growing pause with jitter.
    """

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        """The settings that are not the default, as `client.json` writes them."""
        return {key: value for key, value, default in zip(
            self._fields, self, Timeouts(), strict=True) if value != default}


class ClientConfig(namedtuple("ClientConfig", "path machine transport sources cache state limits "
                              "compress timeouts", defaults=(Limits(), "auto", Timeouts()))):
    """A validated `client.json`, as plain named tuples (`collections.namedtuple`).

    Neither dataclasses nor `typing.NamedTuple` is loaded by a sync. path (a Path), machine (str), transport
    (`Transport`), sources (a tuple of `SourceConfig`), cache and state (Paths), limits
    (`Limits`), compress (str), timeouts (`Timeouts`).
    """

    __slots__ = ()

    @property
    def compresses(self) -> bool:
        """Whether a session asks the server to compress (protocol version 3).

        `auto` compresses over ssh to another machine only: to a local store, or over ssh to
        this one, nothing crosses a network and zlib is CPU spent for nothing.
        """
        if self.compress != "auto":
            return self.compress == "on"
        return self.transport.kind == "ssh" and not self.transport.loopback

    def to_json(self) -> dict[str, Any]:
        """The JSON form written by the installer and read back by `load`."""
        transport: dict[str, Any] = {"kind": self.transport.kind}
        if self.transport.kind == "local":
            transport["store"] = str(self.transport.store)
        else:
            transport["host"] = self.transport.host
            if self.transport.port is not None:
                transport["port"] = self.transport.port
            if self.transport.identity is not None:
                transport["identity"] = str(self.transport.identity)
            transport["options"] = list(self.transport.options)
            transport["remote_command"] = list(self.transport.remote_command)
        out: dict[str, Any] = {
            "version": CONFIG_VERSION,
            "machine": self.machine,
            "transport": transport,
            "sources": [
                {"name": s.name, "kind": s.kind, "path": str(s.path)} for s in self.sources
            ],
            "cache": str(self.cache),
            "state": str(self.state),
            "limits": {
                "file_bytes": self.limits.file_bytes,
                "namespace_bytes": self.limits.namespace_bytes,
                "namespace_files": self.limits.namespace_files,
            },
        }
        if self.compress != "auto":  # the default is left out: installers write the same bytes
            out["compress"] = self.compress
        if timeouts := self.timeouts.to_json():
            out["timeouts"] = timeouts
        return out


def dumps(config: ClientConfig) -> str:
    """Stable text for `client.json`, so re-running an installer writes identical bytes."""
    return json.dumps(config.to_json(), indent=2, ensure_ascii=False) + "\n"


def load(path: Path | str, env: Mapping[str, str] | None = None) -> ClientConfig:
    """Read and validate `client.json`, raising one ConfigError that lists every problem."""
    path = Path(path).expanduser()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"configuration {path} does not exist: run install_client.py, or pass --config with "
            "the path of your client.json"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"configuration {path} cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"configuration {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg}); fix it or re-run install_client.py"
        ) from None
    return parse(raw, path, env if env is not None else os.environ)


def parse(raw: object, path: Path, env: Mapping[str, str]) -> ClientConfig:
    """Validate a decoded configuration; relative paths are relative to the file's folder."""
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise ConfigError(f"configuration {path}: the top level must be a JSON object")
    base = path.parent
    if raw.get("version", CONFIG_VERSION) != CONFIG_VERSION:
        problems.append(f"version must be {CONFIG_VERSION}, not {raw.get('version')!r}")
    machine = raw.get("machine")
    if (problem := name_problem(machine, "machine")) is not None:
        problems.append(problem)
    transport = _transport(raw.get("transport"), base, env, problems)
    sources = _sources(raw.get("sources", []), base, env, problems)
    cache = _path(raw.get("cache"), "cache", base, env, problems)
    state = _path(raw.get("state", str(base / "state")), "state", base, env, problems)
    limits = _limits(raw.get("limits", {}), problems)
    compress = raw.get("compress", "auto")
    if compress not in COMPRESS_MODES:
        problems.append(f"compress must be one of {', '.join(map(repr, COMPRESS_MODES))} "
                        f"(auto: on over ssh to another machine, off for a local store or this "
                        f"machine), not {compress!r}")
        compress = "auto"
    timeouts = _timeouts(raw.get("timeouts", {}), problems)
    known = {"version", "machine", "transport", "sources", "cache", "state", "limits", "compress",
             "timeouts"}
    problems.extend(f"unknown key {key!r}" for key in raw if key not in known)
    if problems:
        listing = "\n  - ".join(problems)
        raise ConfigError(f"configuration {path} has {len(problems)} problem(s):\n  - {listing}")
    return ClientConfig(path, machine, transport, sources, cache, state, limits,  # type: ignore[arg-type]
                        compress, timeouts)


def expand(value: str, env: Mapping[str, str]) -> str:
    """Expand a leading `~` against env's HOME (not the process's), so tests can use a temp home."""
    if value == "~" or value.startswith("~/"):
        home = env.get("HOME") or str(Path.home())
        return home + value[1:]
    return value


def _path(value: object, what: str, base: Path, env: Mapping[str, str],
          problems: list[str]) -> Path:
    if not isinstance(value, str) or not value:
        problems.append(f"{what} must be a non-empty path string, not {value!r}")
        return Path()
    return base / expand(value, env)


def _transport(raw: object, base: Path, env: Mapping[str, str], problems: list[str]) -> Transport:
    if not isinstance(raw, dict) or raw.get("kind") not in TRANSPORTS:
        problems.append("transport must be an object whose kind is 'local' or 'ssh'")
        return Transport("local")
    problems.extend(f"unknown key transport.{key!r}" for key in raw if key not in TRANSPORT_KEYS)
    if raw["kind"] == "local":
        return Transport("local", store=_path(raw.get("store"), "transport.store", base, env,
                                             problems))
    host = raw.get("host")
    if not isinstance(host, str) or not host or host.startswith("-") or any(
            c.isspace() for c in host):
        problems.append(f"transport.host must be an SSH host name such as 'server' or "
                        f"'me@server', not {host!r}")
    port = raw.get("port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool)
                             or not 0 < port < 65536):
        problems.append(f"transport.port must be a TCP port number 1-65535, not {port!r}")
    identity = raw.get("identity")
    ident_path = None
    if identity is not None:
        ident_path = _path(identity, "transport.identity", base, env, problems)
    options = raw.get("options", [])
    if not isinstance(options, list) or not all(isinstance(o, str) and o for o in options):
        problems.append("transport.options must be a list of ssh -o values such as "
                        "'ConnectTimeout=10'")
        options = []
    command = raw.get("remote_command", [])
    if not isinstance(command, list) or not command or not all(
            isinstance(c, str) and c for c in command):
        problems.append("transport.remote_command must be a non-empty list of strings, e.g. "
                        "['python3', '~/.local/share/codex-shared-memory/shared_memory.py', "
                        "'serve', '--store', '~/.local/share/codex-shared-memory/store.sqlite3']")
        command = []
    return Transport("ssh", host=host, port=port, identity=ident_path,
                     options=tuple(options), remote_command=tuple(command))


def _sources(raw: object, base: Path, env: Mapping[str, str],
             problems: list[str]) -> tuple[SourceConfig, ...]:
    if not isinstance(raw, list):
        problems.append("sources must be a list of {name, kind, path} objects")
        return ()
    out: list[SourceConfig] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            problems.append(f"sources[{i}] must be an object with name, kind and path")
            continue
        problems.extend(f"unknown key sources[{i}].{key!r}" for key in item
                        if key not in ("name", "kind", "path"))
        kind, name = item.get("kind"), item.get("name")
        if kind not in SOURCE_KINDS:
            problems.append(f"sources[{i}].kind must be one of {', '.join(SOURCE_KINDS)}, "
                            f"not {kind!r}")
            continue
        if kind == KIND_MARKDOWN:
            try:
                check_markdown_source_name(name)
            except Exception as exc:  # noqa: BLE001 - collected, reported once
                problems.append(f"sources[{i}]: {exc}")
                continue
        elif name != kind:
            problems.append(f"sources[{i}]: a {kind} source must be named {kind!r}, not {name!r}")
            continue
        if name in seen:
            problems.append(f"sources[{i}]: source {name!r} is configured twice")
            continue
        seen.add(name)
        out.append(SourceConfig(name, kind, _path(item.get("path"), f"sources[{i}].path", base,
                                                  env, problems)))
    return tuple(out)


def _limits(raw: object, problems: list[str]) -> Limits:
    if not isinstance(raw, dict):
        problems.append("limits must be an object")
        return Limits()
    known = {"file_bytes", "namespace_bytes", "namespace_files"}
    problems.extend(f"unknown limit {key!r}" for key in raw if key not in known)
    limits = Limits(**{k: v for k, v in raw.items() if k in known})
    problems.extend(limits.problems())
    return limits


def _timeouts(raw: object, problems: list[str]) -> Timeouts:
    """The `timeouts` object: seconds as positive numbers, the rate and retries as integers."""
    if not isinstance(raw, dict):
        problems.append("timeouts must be an object such as {\"reply_seconds\": 120}")
        return Timeouts()
    problems.extend(f"unknown key timeouts.{key!r} (known: {', '.join(Timeouts._fields)})"
                    for key in raw if key not in Timeouts._fields)
    values: dict[str, Any] = {}
    for key in ("reply_seconds", "session_seconds"):
        value = raw.get(key, getattr(Timeouts(), key))
        if type(value) not in (int, float) or not 0 < value <= MAX_TIMEOUT_SECONDS:
            problems.append(f"timeouts.{key} must be a number of seconds above 0 and at most "
                            f"{MAX_TIMEOUT_SECONDS}, not {value!r}")
            continue
        values[key] = value
    rate = raw.get("session_rate", Timeouts().session_rate)
    if type(rate) is not int or rate < 1:
        problems.append(f"timeouts.session_rate must be a whole number of bytes a second, at "
                        f"least 1, not {rate!r}")
    else:
        values["session_rate"] = rate
    retries = raw.get("busy_retries", Timeouts().busy_retries)
    if type(retries) is not int or not 0 <= retries <= MAX_BUSY_RETRIES:
        problems.append(f"timeouts.busy_retries must be a whole number from 0 to "
                        f"{MAX_BUSY_RETRIES}, not {retries!r}")
    else:
        values["busy_retries"] = retries
    return Timeouts(**values)
