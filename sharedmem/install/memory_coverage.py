"""Which harness memory this machine's sources publish.

Where each harness writes memory today, from its own settings, and whether a configured source
reads it. `doctor` turns each finding into a check and the client installer into a line of its summary;
a harness whose memory would be missed is a warning that names the fix.
"""

from __future__ import annotations

import os
from collections import namedtuple
from collections.abc import Mapping, Sequence
from pathlib import Path

from sharedmem.client.config import SourceConfig
from sharedmem.core import SharedMemoryError
from sharedmem.install import harnesses
from sharedmem.rules import KIND_MARKDOWN, SOURCE_CLAUDE, SOURCE_CODEX
from sharedmem.sources import allowlist, harness_memory

OK, WARN = "ok", "warn"
FIX_SOURCE = "re-run install_client.py with --source {kind} (and the --source and --markdown " \
             "options you use now): the {kind} source reads every folder {harness} writes to"
NO_MEMORY = {"opencode": "OpenCode keeps no memory files of its own: nothing to publish",
             "cursor": "Cursor keeps no memory files on this machine: nothing to publish"}


class Coverage(namedtuple("Coverage", "harness status message fix folders")):
    """One harness's memory: ok or warn, a sentence, the fix (for a warning), the folders."""

    __slots__ = ()


def _same(a: Path, b: Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def _exists(folder: Path) -> bool:
    return folder.is_dir()


def _claude_folders(found: harness_memory.ClaudeMemory) -> list[Path]:
    """The folders Claude Code writes memory to: per project (or the relocated one), subagents."""
    default = found.projects / "<project>" / "memory"
    return [found.relocated or default, found.agents]


def codex(sources: Sequence[SourceConfig], env: Mapping[str, str], machine: str) -> Coverage:
    """Codex's memory folders, as its configuration resolves them, and the source that reads them."""
    home = harnesses.codex_home(env)
    found = harness_memory.codex_memory(home, env)
    folders = [root for _, root in found.roots]
    where = ", ".join(str(f) for f in folders)
    said = f"writes {where} (version {found.version}: {found.why})"
    problems = "; ".join(found.problems)
    source = next((s for s in sources if s.kind == SOURCE_CODEX
                   and harness_memory.codex_home_of(s.path) is not None
                   and _same(harness_memory.codex_home_of(s.path), home)), None)
    strays = [s for s in sources if s.kind == KIND_MARKDOWN
              and any(harness_memory.within(s.path, home / d)
                      or harness_memory.within(home / d, s.path)
                      for d in (harness_memory.CODEX_V1_DIR, harness_memory.CODEX_V2_DIR))]
    if strays:
        names = ", ".join(s.name for s in strays)
        return Coverage("codex", WARN, f"{said}; markdown source {names} reads Codex's memory "
                        "folder, publishing raw memories, workspace diffs and skill files the "
                        "codex allowlist keeps out", f"remove markdown source {names} and "
                        "publish Codex's memory with the codex source: "
                        + FIX_SOURCE.format(kind="codex", harness="Codex"), folders)
    if source is not None:
        shown = ", ".join(f"machines/{machine}/codex/"
                          + ("" if name == harness_memory.CODEX_V1_DIR else allowlist.CODEX_V2
                             + "/") for name, _ in found.roots)
        message = f"{said}; published by source {source.name} as {shown}"
        if problems:
            return Coverage("codex", WARN, f"{message}; but {problems}", "fix the file named, "
                            "as Codex itself would refuse it", folders)
        return Coverage("codex", OK, message, "", folders)
    if not any(_exists(f) for f in folders):
        return Coverage("codex", OK, f"{said}; it has written no memory there yet, and no "
                        "source publishes it", "", folders)
    return Coverage("codex", WARN, f"{said}; no codex source publishes it, so other machines "
                    "never see it", FIX_SOURCE.format(kind="codex", harness="Codex"), folders)


def claude(sources: Sequence[SourceConfig], env: Mapping[str, str], machine: str) -> Coverage:
    """Claude Code's memory folders, as its settings resolve them, and the source that reads them."""
    config_dir = harnesses.claude_dir(env)
    found = harness_memory.claude_memory(config_dir, env)
    folders = _claude_folders(found)
    ns = f"machines/{machine}/claude-code/"
    if found.relocated is not None:
        said = (f"writes its automatic memory to {found.relocated} (autoMemoryDirectory in "
                f"{found.relocated_by}) and subagent memory to {found.agents}")
        published = f"{ns}{allowlist.CLAUDE_RELOCATED}/ and {ns}{allowlist.CLAUDE_AGENTS}/"
    else:
        said = (f"writes its automatic memory to {folders[0]} and subagent memory to "
                f"{found.agents}")
        published = f"{ns}<project>/ and {ns}{allowlist.CLAUDE_AGENTS}/"
    notes = list(found.problems)
    if found.relocated is None and found.relocated_by is not None:
        notes.append(f"autoMemoryDirectory in {found.relocated_by} is not an absolute folder, "
                     "so Claude Code ignores it")
    source = next((s for s in sources if s.kind == SOURCE_CLAUDE
                   and _same(s.path.parent, config_dir)), None)
    if source is not None:
        message = f"{said}; published by source {source.name} as {published}"
        if notes:
            return Coverage("claude-code", WARN, f"{message}; but {'; '.join(notes)}",
                            "fix the settings file named", folders)
        return Coverage("claude-code", OK, message, "", folders)
    present = [f for f in (found.projects, found.relocated, found.agents) if f and _exists(f)]
    if not present:
        return Coverage("claude-code", OK, f"{said}; it has written no memory there yet, and "
                        "no source publishes it", "", folders)
    return Coverage("claude-code", WARN, f"{said}; no claude-code source publishes it, so other "
                    "machines never see it", FIX_SOURCE.format(kind="claude-code",
                                                               harness="Claude Code"), folders)


def coverage(sources: Sequence[SourceConfig], env: Mapping[str, str], machine: str,
             names: Sequence[str]) -> list[Coverage]:
    """One finding per harness in `names`; a harness whose settings cannot be found is a warning."""
    out = []
    for name in names:
        try:
            if name == "codex":
                out.append(codex(sources, env, machine))
            elif name == "claude-code":
                out.append(claude(sources, env, machine))
            else:
                out.append(Coverage(name, OK, NO_MEMORY[name], "", []))
        except SharedMemoryError as exc:
            out.append(Coverage(name, WARN, f"where it writes memory is unknown: {exc}",
                                "set HOME and try again", []))
    return out
