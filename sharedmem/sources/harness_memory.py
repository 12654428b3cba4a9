"""Where Codex and Claude Code write their memory today, as their own settings say.

Codex (checked against 0.171.0) keeps its memory in `$CODEX_HOME/memories` (version 1) or
`$CODEX_HOME/memories_v2` (version 2). `memories.version` in its configuration picks one; unset,
Codex takes version 1 when `memories/` exists and version 2 otherwise; `memories.dual_write =
true` makes version 1 write version 2's folder too (it changes nothing under version 2). The
configuration is layered as Codex layers it: `/etc/codex/config.toml`, then
`$CODEX_HOME/config.toml`, then `/etc/codex/managed_config.toml`, each later one winning.

Claude Code (checked against 2.1.332) writes its automatic memory to
`<config dir>/projects/<project>/memory/` unless `autoMemoryDirectory` names another folder: the
managed settings file (and the `.json` files of `managed-settings.d/` beside it, in name order)
win over the user's `<config dir>/settings.json`, and the first of them that sets the key
decides; a value that is not an absolute path (after `~/` is expanded) is ignored and the
default place is used. A subagent with user-scoped memory writes `<config dir>/agent-memory/
<agent>/`. The config dir is `$CLAUDE_CONFIG_DIR`, else `~/.claude`.

System-wide files are read below `$SHAREDMEM_SYSTEM_ROOT` when it is set (a folder that stands
for `/`, or for the `C:` drive on Windows): for tests, and for an administrator checking an
image.
"""

from __future__ import annotations

import os
import sys
from collections import namedtuple
from collections.abc import Mapping
from pathlib import Path, PureWindowsPath

SYSTEM_ROOT_ENV = "SHAREDMEM_SYSTEM_ROOT"
CODEX_V1_DIR = "memories"
CODEX_V2_DIR = "memories_v2"
CODEX_VERSIONS = ("v1", "v2")
CLAUDE_PROJECTS_DIR = "projects"
CLAUDE_AGENTS_DIR = "agent-memory"
CLAUDE_SETTINGS = "settings.json"
CLAUDE_KEY = "autoMemoryDirectory"
# Where Claude Code looks for its managed settings file, by platform (sys.platform prefix).
CLAUDE_MANAGED = {"darwin": ("Library", "Application Support", "ClaudeCode"),
                  "win32": ("Program Files", "ClaudeCode")}
CLAUDE_MANAGED_LINUX = ("etc", "claude-code")
CLAUDE_MANAGED_FILE = "managed-settings.json"
CLAUDE_MANAGED_DROPINS = "managed-settings.d"
CODEX_SYSTEM = ("etc", "codex")


class CodexMemory(namedtuple("CodexMemory", "home version dual_write why roots problems")):
    """Codex's memory as its configuration resolves it.

    home (a Path), version ("v1" or "v2"), dual_write (bool), why (a sentence: which setting
    or file decided the version), roots (a tuple of (folder name, Path) Codex writes, the one
    it reads first), problems (configuration files that could not be read, with why).
    """

    __slots__ = ()


class ClaudeMemory(namedtuple("ClaudeMemory", "config_dir projects relocated relocated_by "
                              "agents problems")):
    """Claude Code's memory folders as its settings resolve them.

    config_dir, projects and agents (Paths: the config folder, the default per-project memory
    under `projects/`, subagents' user-scoped memory), relocated (the folder
    `autoMemoryDirectory` names, or None), relocated_by (the settings file that decided it, or
    None), problems (settings files that could not be read, with why).
    """

    __slots__ = ()


def system_path(env: Mapping[str, str], *parts: str, platform: str = sys.platform) -> Path:
    """A system-wide file: below `$SHAREDMEM_SYSTEM_ROOT` when set, else below `/` (or `C:`)."""
    root = env.get(SYSTEM_ROOT_ENV)
    if root:
        return Path(root, *parts)
    if platform == "win32":
        return Path(str(PureWindowsPath("C:\\", *parts)))
    return Path("/", *parts)


def within(path: Path, folder: Path) -> bool:
    """Whether `path` is `folder` or below it, as absolute paths (links are not resolved)."""
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(folder))
    except ValueError:
        return False
    return True


def home_of(env: Mapping[str, str]) -> Path:
    """The account's home as the harnesses see it: HOME (USERPROFILE on Windows)."""
    home = env.get("HOME") or env.get("USERPROFILE")
    return Path(home) if home else Path.home()


# --- Codex ----------------------------------------------------------------------------------------

def codex_home_of(root: Path) -> Path | None:
    """The Codex home a codex source's folder belongs to: its parent when it is `memories`."""
    return root.parent if root.name == CODEX_V1_DIR else None


def _toml_layer(path: Path, problems: list[str]) -> dict:
    """One configuration file's `memories` table ({} when absent or unreadable)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        problems.append(f"{path} cannot be read ({exc.strerror or exc})")
        return {}
    import tomllib  # only a Codex home with a configuration pays for it
    try:
        table = tomllib.loads(data.decode("utf-8")).get("memories", {})
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        problems.append(f"{path} is not valid TOML ({exc}); Codex refuses to start with it")
        return {}
    return table if isinstance(table, dict) else {}


def codex_memory(home: Path, env: Mapping[str, str]) -> CodexMemory:
    """Which memory folders Codex uses in `home`, from its layered configuration."""
    problems: list[str] = []
    files = [system_path(env, *CODEX_SYSTEM, "config.toml"), home / "config.toml",
             system_path(env, *CODEX_SYSTEM, "managed_config.toml")]
    version = dual = None
    version_from = dual_from = None
    for path in files:
        table = _toml_layer(path, problems)
        if "version" in table:
            version, version_from = table["version"], path
        if "dual_write" in table:
            dual, dual_from = table["dual_write"], path
    if version is not None and version not in CODEX_VERSIONS:
        problems.append(f"memories.version = {version!r} in {version_from} is not one of "
                        f"{', '.join(CODEX_VERSIONS)}; Codex refuses to start with it")
        version = None
    if dual is not None and not isinstance(dual, bool):
        problems.append(f"memories.dual_write = {dual!r} in {dual_from} is not true or false")
        dual = None
    if version is not None:
        why = f"memories.version = \"{version}\" in {version_from}"
    elif (home / CODEX_V1_DIR).is_dir():
        version, why = "v1", f"memories.version is not set and {home / CODEX_V1_DIR} exists"
    else:
        version, why = "v2", f"memories.version is not set and {home / CODEX_V1_DIR} does not exist"
    dual_write = bool(dual)
    roots = [(CODEX_V2_DIR, home / CODEX_V2_DIR)] if version == "v2" else [
        (CODEX_V1_DIR, home / CODEX_V1_DIR)]
    if version == "v1" and dual_write:
        roots.append((CODEX_V2_DIR, home / CODEX_V2_DIR))
        why += f", and memories.dual_write = true in {dual_from}"
    return CodexMemory(home, version, dual_write, why, tuple(roots), tuple(problems))


# --- Claude Code ----------------------------------------------------------------------------------

def claude_managed_file(env: Mapping[str, str], platform: str = sys.platform) -> Path:
    """Where Claude Code reads its managed settings file on `platform` (this one's by default)."""
    parts = next((p for prefix, p in CLAUDE_MANAGED.items() if platform.startswith(prefix)),
                 CLAUDE_MANAGED_LINUX)
    return system_path(env, *parts, CLAUDE_MANAGED_FILE, platform=platform)


def _json_settings(path: Path, problems: list[str]) -> dict:
    """One settings file's object ({} when absent or unreadable, as Claude Code takes it)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{path} cannot be read ({getattr(exc, 'strerror', None) or exc})")
        return {}
    from sharedmem.core import JSONError
    from sharedmem.fastjson import loads
    try:
        data = loads(text) if text.strip() else {}
    except JSONError as exc:
        problems.append(f"{path} is not valid JSON ({exc}); Claude Code ignores it")
        return {}
    return data if isinstance(data, dict) else {}


def _managed_files(env: Mapping[str, str]) -> list[Path]:
    """The managed settings file, then its drop-ins (`.json`, not hidden, in name order)."""
    main = claude_managed_file(env)
    folder = main.parent / CLAUDE_MANAGED_DROPINS
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json")
                       and not n.startswith("."))
    except OSError:
        names = []
    return [main, *(folder / n for n in names)]


def relocated_folder(value: object, env: Mapping[str, str]) -> Path | None:
    """The folder an `autoMemoryDirectory` value names, or None where Claude Code ignores it."""
    if not isinstance(value, str) or not value or "\x00" in value:
        return None
    text = value
    if text.startswith(("~/", "~\\")):
        rest = os.path.normpath(text[2:] or ".")
        if rest in (".", "..") or rest.startswith(("../", "..\\")):
            return None  # the home itself, or a way out of it
        text = str(home_of(env) / rest)
    path = Path(os.path.normpath(text))
    if not path.is_absolute() or len(str(path)) < 3 or path == Path(path.anchor):
        return None
    return path


def claude_memory(config_dir: Path, env: Mapping[str, str]) -> ClaudeMemory:
    """Claude Code's memory folders for the config folder `config_dir`, from its settings."""
    problems: list[str] = []
    relocated = relocated_by = None
    for paths in (_managed_files(env), [config_dir / CLAUDE_SETTINGS]):
        found = None
        for path in paths:  # within the managed files, the later one wins
            settings = _json_settings(path, problems)
            if settings.get(CLAUDE_KEY) is not None:
                found = (settings[CLAUDE_KEY], path)
        if found is not None:  # the first layer that sets the key decides, valid or not
            relocated, relocated_by = relocated_folder(found[0], env), found[1]
            break
    return ClaudeMemory(config_dir, config_dir / CLAUDE_PROJECTS_DIR, relocated, relocated_by,
                        config_dir / CLAUDE_AGENTS_DIR, tuple(problems))
