"""client.json: round trip, one error listing every problem, paths, names, the transport."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sharedmem.client import config
from sharedmem.core import ConfigError
from sharedmem.rules import Limits


def write(path: Path, raw: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw), encoding="utf-8")
    return path


def ssh_raw(**transport: object) -> dict:
    """A valid ssh configuration, with transport fields overridden."""
    return {
        "version": 1, "machine": "laptop",
        "transport": {"kind": "ssh", "host": "me@server", "port": 2222, "identity": "/k/id",
                      "options": ["ConnectTimeout=10"],
                      "remote_command": ["python3", "~/p/shared_memory.py", "serve"],
                      **transport},
        "sources": [{"name": "codex", "kind": "codex", "path": "/m/codex"},
                    {"name": "claude-code", "kind": "claude-code", "path": "/m/claude"},
                    {"name": "notes", "kind": "markdown", "path": "/m/notes"}],
        "cache": "/c/cache", "state": "/c/state",
        "limits": {"file_bytes": 1000, "namespace_bytes": 5000, "namespace_files": 7},
    }


def problems_of(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [line[4:] for line in str(exc.value).splitlines() if line.startswith("  - ")]


@pytest.mark.parametrize("raw", [
    ssh_raw(),
    {"machine": "pc", "transport": {"kind": "local", "store": "/s/store.sqlite3"},
     "sources": [], "cache": "/c"},
])
def test_round_trip(tmp_path: Path, raw: dict) -> None:
    first = config.load(write(tmp_path / "client.json", raw), {"HOME": str(tmp_path)})
    text = config.dumps(first)
    again = config.load(write(tmp_path / "again" / "client.json", text), {"HOME": str(tmp_path)})
    assert config.dumps(again) == text
    assert again.machine == first.machine and again.transport == first.transport
    assert again.sources == first.sources and again.limits == first.limits
    assert again.cache == first.cache and again.state == first.state
    assert text.endswith("\n") and json.loads(text)["version"] == 1


def test_round_trip_values(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path / "client.json", ssh_raw()), {"HOME": str(tmp_path)})
    assert cfg.transport == config.Transport(
        "ssh", host="me@server", port=2222, identity=Path("/k/id"),
        options=("ConnectTimeout=10",), remote_command=("python3", "~/p/shared_memory.py", "serve"))
    assert [(s.name, s.kind, s.path) for s in cfg.sources] == [
        ("codex", "codex", Path("/m/codex")), ("claude-code", "claude-code", Path("/m/claude")),
        ("notes", "markdown", Path("/m/notes"))]
    assert cfg.limits == Limits(1000, 5000, 7)
    assert cfg.state == Path("/c/state")


def test_defaults(tmp_path: Path) -> None:
    path = write(tmp_path / "cfg" / "client.json", {
        "machine": "pc", "transport": {"kind": "local", "store": "s.sqlite3"}, "cache": "c"})
    cfg = config.load(path, {})
    assert cfg.sources == () and cfg.limits == Limits()
    assert cfg.state == tmp_path / "cfg" / "state"


def test_every_problem_in_one_error(tmp_path: Path) -> None:
    raw = {
        "version": 2,
        "machine": "Bad Name",
        "transport": {"kind": "ssh", "host": "-oProxyCommand=evil", "port": 70000,
                      "options": [""], "remote_command": [], "identiy": "/typo"},
        "sources": [{"name": "codex", "kind": "markdown", "path": "/a"},
                    {"name": "notes", "kind": "markdown", "path": "/a"},
                    {"name": "notes", "kind": "markdown", "path": "/b"},
                    {"name": "x", "kind": "vim", "path": "/c"},
                    {"name": "other", "kind": "codex", "path": "/d"},
                    "not an object",
                    {"name": "ok", "kind": "markdown", "path": "/e", "pth": "/typo"}],
        "limits": {"file_bytes": 0, "bogus": 1},
        "extra": True,
    }
    with pytest.raises(ConfigError) as exc:
        config.load(write(tmp_path / "client.json", raw), {})
    found = problems_of(exc)
    expected = [
        "version must be 1", "machine 'Bad Name' is invalid", "unknown key transport.'identiy'",
        "transport.host must be an SSH host", "transport.port must be a TCP port",
        "transport.options must be a list", "transport.remote_command must be a non-empty list",
        "sources[0]: source name 'codex' is reserved", "sources[2]: source 'notes' is configured "
        "twice", "sources[3].kind must be one of", "sources[4]: a codex source must be named "
        "'codex'", "sources[5] must be an object", "unknown key sources[6].'pth'",
        "cache must be a non-empty path string", "unknown limit 'bogus'",
        "limit file_bytes must be a positive integer", "unknown key 'extra'"]
    for needle in expected:
        assert any(needle in p for p in found), (needle, found)
    assert len(found) == len(expected)
    assert f"has {len(expected)} problem(s)" in str(exc.value)
    assert str(tmp_path / "client.json") in str(exc.value)


def test_missing_unreadable_and_invalid_json(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "client.json"
    with pytest.raises(ConfigError, match="does not exist") as exc:
        config.load(missing, {})
    assert str(missing) in str(exc.value) and "install_client.py" in str(exc.value)
    bad = write(tmp_path / "bad.json", '{\n  "machine": "pc",\n  "cache": }\n')
    with pytest.raises(ConfigError, match=r"not valid JSON \(line 3, column 12") as exc:
        config.load(bad, {})
    assert str(bad) in str(exc.value)
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match="cannot be read"):
        config.load(tmp_path / "binary.json", {})
    with pytest.raises(ConfigError, match="top level must be a JSON object"):
        config.load(write(tmp_path / "list.json", "[1]"), {})


def test_tilde_expands_against_the_given_home(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "process-home"))
    fake = tmp_path / "fake-home"
    raw = ssh_raw(identity="~/.ssh/id_ed25519")
    raw.update(cache="~/cache", state="~", sources=[{"name": "n", "kind": "markdown",
                                                     "path": "~/notes"}])
    cfg = config.load(write(tmp_path / "cfg" / "client.json", raw), {"HOME": str(fake)})
    assert cfg.cache == fake / "cache" and cfg.state == fake
    assert cfg.sources[0].path == fake / "notes"
    assert cfg.transport.identity == fake / ".ssh" / "id_ed25519"
    assert cfg.transport.remote_command[1] == "~/p/shared_memory.py"  # expanded on the server
    assert config.expand("~other/x", {"HOME": str(fake)}) == "~other/x"
    assert config.expand("a/~/b", {"HOME": str(fake)}) == "a/~/b"


def test_relative_paths_are_relative_to_the_config_folder(tmp_path: Path) -> None:
    folder = tmp_path / "conf"
    raw = ssh_raw(identity="keys/id")
    raw.update(cache="cache", state="../state", sources=[{"name": "n", "kind": "markdown",
                                                          "path": "notes"}])
    cfg = config.load(write(folder / "client.json", raw), {})
    assert cfg.cache == folder / "cache" and cfg.state == folder / ".." / "state"
    assert cfg.sources[0].path == folder / "notes"
    assert cfg.transport.identity == folder / "keys" / "id"
    local = write(folder / "local.json", {"machine": "pc", "cache": "c",
                                          "transport": {"kind": "local", "store": "s.db"}})
    assert config.load(local, {}).transport.store == folder / "s.db"


@pytest.mark.parametrize("source,needle", [
    ({"name": "codex", "kind": "markdown", "path": "/a"}, "reserved"),
    ({"name": "claude-code", "kind": "markdown", "path": "/a"}, "reserved"),
    ({"name": "Notes", "kind": "markdown", "path": "/a"}, "is invalid"),
    ({"name": "notes", "kind": "claude-code", "path": "/a"}, "must be named 'claude-code'"),
    ({"name": "notes", "kind": "markdown", "path": ""}, "sources[0].path must be a non-empty"),
])
def test_source_names(tmp_path: Path, source: dict, needle: str) -> None:
    raw = ssh_raw()
    raw["sources"] = [source]
    with pytest.raises(ConfigError, match="1 problem") as exc:
        config.load(write(tmp_path / "client.json", raw), {})
    assert needle in str(exc.value)


def test_duplicate_sources(tmp_path: Path) -> None:
    raw = ssh_raw()
    raw["sources"].append({"name": "codex", "kind": "codex", "path": "/other"})
    with pytest.raises(ConfigError, match=r"sources\[3\]: source 'codex' is configured twice"):
        config.load(write(tmp_path / "client.json", raw), {})


@pytest.mark.parametrize("port", [0, 65536, -1, "22", True, 22.0])
def test_bad_port(tmp_path: Path, port: object) -> None:
    with pytest.raises(ConfigError, match="transport.port must be a TCP port number") as exc:
        config.load(write(tmp_path / "client.json", ssh_raw(port=port)), {})
    assert "1 problem" in str(exc.value)


@pytest.mark.parametrize("port", [1, 22, 65535])
def test_good_port(tmp_path: Path, port: int) -> None:
    assert config.load(write(tmp_path / "c.json", ssh_raw(port=port)), {}).transport.port == port


@pytest.mark.parametrize("host", ["-oProxyCommand=touch /tmp/x", "-p", "", "me@ server", None, 5])
def test_bad_ssh_host(tmp_path: Path, host: object) -> None:
    with pytest.raises(ConfigError, match="transport.host must be an SSH host name"):
        config.load(write(tmp_path / "client.json", ssh_raw(host=host)), {})


@pytest.mark.parametrize("transport,needle", [
    (None, "transport must be an object"),
    ({"kind": "telnet"}, "transport must be an object"),
    ({"kind": "local"}, "transport.store must be a non-empty path"),
    ({"kind": "local", "store": "/s", "hots": "x"}, "unknown key transport.'hots'"),
])
def test_bad_transport(tmp_path: Path, transport: object, needle: str) -> None:
    raw = ssh_raw()
    raw["transport"] = transport
    with pytest.raises(ConfigError, match="1 problem") as exc:
        config.load(write(tmp_path / "client.json", raw), {})
    assert needle in str(exc.value)


@pytest.mark.parametrize("limits,needle", [
    ({"file_bytes": True}, "file_bytes must be a positive integer"),
    ({"namespace_files": "10"}, "namespace_files must be a positive integer"),
    ({"namespace_bytes": -5}, "namespace_bytes must be a positive integer"),
    ({"max": 1}, "unknown limit 'max'"),
    ([], "limits must be an object"),
])
def test_bad_limits(tmp_path: Path, limits: object, needle: str) -> None:
    raw = ssh_raw()
    raw["limits"] = limits
    with pytest.raises(ConfigError, match="1 problem") as exc:
        config.load(write(tmp_path / "client.json", raw), {})
    assert needle in str(exc.value)


@pytest.mark.parametrize(("value", "kind", "compresses"), [
    (None, "ssh", True), (None, "local", False), ("auto", "ssh", True), ("auto", "local", False),
    ("on", "local", True), ("off", "ssh", False),
])
def test_compress_setting(tmp_path: Path, value: str | None, kind: str, compresses: bool) -> None:
    raw = ssh_raw() if kind == "ssh" else {"machine": "pc", "cache": "/c", "transport": {
        "kind": "local", "store": "/s/store.sqlite3"}}
    if value is not None:
        raw["compress"] = value
    cfg = config.load(write(tmp_path / "client.json", raw), {})
    assert cfg.compress == (value or "auto") and cfg.compresses is compresses
    again = config.load(write(tmp_path / "again" / "client.json", config.dumps(cfg)), {})
    assert again.compress == cfg.compress
    assert ("compress" in json.loads(config.dumps(cfg))) is (value not in (None, "auto"))


@pytest.mark.parametrize(("host", "options", "compresses"), [
    ("me@127.0.0.1", [], False), ("localhost", ["ConnectTimeout=10"], False),
    ("me@::1", [], False), ("me@LocalHost", [], False), ("127.1.2.3", [], False),
    ("me@server", [], True), ("me@10.0.0.1", [], True), ("me@localhost.example.org", [], True),
    ("me@127.0.0.1", ["ProxyCommand=relay %h %p"], True),
    ("me@127.0.0.1", ["proxyjump gateway"], True), ("me@localhost", ["ProxyJump=g"], True),
])
def test_auto_does_not_compress_ssh_to_this_machine(tmp_path: Path, host: str,
                                                    options: list[str], compresses: bool) -> None:
    """Over ssh to a loopback host nothing crosses a network; a proxy may lead anywhere."""
    cfg = config.load(write(tmp_path / "client.json", ssh_raw(host=host, options=options)), {})
    assert cfg.transport.loopback is not compresses
    assert cfg.compresses is compresses
    on = config.load(write(tmp_path / "on" / "client.json",
                           {**ssh_raw(host=host, options=options), "compress": "on"}), {})
    assert on.compresses


@pytest.mark.parametrize("value", ["yes", True, 1, ["zlib"], ""])
def test_bad_compress_setting(tmp_path: Path, value: object) -> None:
    path = write(tmp_path / "client.json", {**ssh_raw(), "compress": value})
    with pytest.raises(ConfigError) as exc:
        config.load(path, {})
    assert str(path) in str(exc.value)
    assert problems_of(exc) == [f"compress must be one of 'auto', 'on', 'off' (auto: on over "
                                f"ssh to another machine, off for a local store or this "
                                f"machine), not {value!r}"]


def test_timeouts_default_and_are_written_only_when_set(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path / "client.json", ssh_raw()), {})
    assert cfg.timeouts == config.Timeouts(120.0, 300.0, 4096, 4)
    assert "timeouts" not in json.loads(config.dumps(cfg))
    raw = {**ssh_raw(), "timeouts": {"reply_seconds": 2, "session_seconds": 0.5,
                                     "session_rate": 1000, "busy_retries": 0}}
    cfg = config.load(write(tmp_path / "set" / "client.json", raw), {})
    assert cfg.timeouts == config.Timeouts(2, 0.5, 1000, 0)
    assert json.loads(config.dumps(cfg))["timeouts"] == raw["timeouts"]
    again = config.load(write(tmp_path / "again" / "client.json", config.dumps(cfg)), {})
    assert again.timeouts == cfg.timeouts
    partial = {**ssh_raw(), "timeouts": {"reply_seconds": 4096, "busy_retries": 4}}
    cfg = config.load(write(tmp_path / "partial" / "client.json", partial), {})
    assert json.loads(config.dumps(cfg))["timeouts"] == {"reply_seconds": 4096}


def test_bad_timeouts_are_each_named_once(tmp_path: Path) -> None:
    raw = {**ssh_raw(), "timeouts": {"reply_seconds": 0, "session_seconds": "300",
                                     "session_rate": 2.5, "busy_retries": 11, "idle": 5}}
    with pytest.raises(ConfigError) as exc:
        config.load(write(tmp_path / "client.json", raw), {})
    assert problems_of(exc) == [
        "unknown key timeouts.'idle' (known: reply_seconds, session_seconds, session_rate, "
        "busy_retries)",
        "timeouts.reply_seconds must be a number of seconds above 0 and at most 86400, not 0",
        "timeouts.session_seconds must be a number of seconds above 0 and at most 86400, "
        "not '300'",
        "timeouts.session_rate must be a whole number of bytes a second, at least 1, not 2.5",
        "timeouts.busy_retries must be a whole number from 0 to 10, not 11"]
    for bad in ([], "60", None):
        with pytest.raises(ConfigError, match="timeouts must be an object"):
            config.load(write(tmp_path / "client.json", {**ssh_raw(), "timeouts": bad}), {})
    for bad in (True, float("nan"), 86_401, -1):
        with pytest.raises(ConfigError, match="timeouts.reply_seconds must be"):
            config.load(write(tmp_path / "client.json",
                              {**ssh_raw(), "timeouts": {"reply_seconds": bad}}), {})
