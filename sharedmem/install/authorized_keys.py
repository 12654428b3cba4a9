"""SSH public keys and `~/.ssh/authorized_keys`: one pinned line per key, kept strict for sshd.

A pinned line runs `serve --machine NAME` as a forced command, so the key can do nothing
but sync as that machine. A key is pinned to one machine at most; moving it is an explicit
`--repin`. The file is backed up before every change and written atomically with mode 0600.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import shlex
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sharedmem.client.config import expand
from sharedmem.clock import utc_now
from sharedmem.core import InstallError
from sharedmem.files import atomic_write
from sharedmem.program import PYTHON_FLAGS

KEY_TYPES = frozenset({
    "ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"})
_MACHINE_RE = re.compile(r"--machine\s+'?([a-z0-9][a-z0-9._-]*)'?")
_COMMAND_RE = re.compile(r'command="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class PublicKey:
    """A validated OpenSSH public key; `text` is the one line as given (comment kept)."""

    kind: str
    blob: str
    comment: str

    @property
    def text(self) -> str:
        """The key as an authorized_keys line ends: type, base64 blob, comment."""
        return " ".join(p for p in (self.kind, self.blob, self.comment) if p)

    @property
    def fingerprint(self) -> str:
        """The SHA256 fingerprint, as `ssh-keygen -l` prints it."""
        digest = hashlib.sha256(base64.b64decode(self.blob)).digest()
        return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


@dataclass
class Outcome:
    """What authorizing a key did (or, in a dry run, would do)."""

    path: Path
    action: str  # "added" | "updated" | "unchanged"
    line: str
    backup: Path | None = None
    message: str = ""
    warnings: list[str] = field(default_factory=list)


def _blob_fields(blob: bytes) -> list[bytes]:
    """Split an SSH wire-format blob into its length-prefixed fields; raise when malformed."""
    fields, i = [], 0
    while i < len(blob):
        if i + 4 > len(blob):
            raise ValueError("truncated length")
        size = int.from_bytes(blob[i:i + 4], "big")
        if i + 4 + size > len(blob):
            raise ValueError("truncated field")
        fields.append(blob[i + 4:i + 4 + size])
        i += 4 + size
    return fields


def parse_key(value: str, env: Mapping[str, str]) -> PublicKey:
    """Validate `--key`: the public key text itself, or the path of a `.pub` file."""
    text, where = value.strip(), "--key"
    if not text:
        raise InstallError("--key is empty: pass the client's public key file or its text")
    if text.split(None, 1)[0] not in KEY_TYPES:
        path = Path(expand(text, env))
        if path.is_file():
            try:
                text, where = path.read_text(encoding="utf-8").strip(), str(path)
            except (OSError, UnicodeDecodeError) as exc:
                raise InstallError(f"cannot read the key file {path}: {exc}") from None
        elif text.endswith(".pub") or "/" in text:
            raise InstallError(f"--key {value!r}: no such file; pass the client's public key "
                               "file (e.g. ~/.ssh/id_ed25519.pub) or its text")
    if "PRIVATE KEY" in text:
        raise InstallError(f"{where} holds a PRIVATE key: never copy it; pass the .pub file "
                           "(the public half) instead")
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise InstallError(f"{where} must hold exactly one public key line, not {len(lines)}")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or parts[0] not in KEY_TYPES:
        raise InstallError(f"{where} is not an OpenSSH public key: expected 'TYPE BASE64 "
                           f"[comment]' with TYPE one of {', '.join(sorted(KEY_TYPES))} -- "
                           "e.g. the contents of ~/.ssh/id_ed25519.pub (make one with "
                           "ssh-keygen -t ed25519)")
    kind, blob = parts[0], parts[1]
    try:
        fields = _blob_fields(base64.b64decode(blob, validate=True))
    except (binascii.Error, ValueError):
        raise InstallError(f"{where}: the key's base64 part is damaged; copy the whole "
                           ".pub line again") from None
    if not fields or fields[0] != kind.encode("ascii") or len(fields) < 2:
        raise InstallError(f"{where}: the key data does not match its type {kind!r}; copy "
                           "the whole .pub line again")
    comment = parts[2].strip() if len(parts) > 2 else ""
    return PublicKey(kind, blob, comment)


def split_line(line: str) -> tuple[str, str] | None:
    """An authorized_keys line as (options, base64 blob), or None for blanks and comments."""
    rest = line.strip()
    if not rest or rest.startswith("#"):
        return None
    options = ""
    if rest.split(None, 1)[0] not in KEY_TYPES:
        i, quoted = 0, False
        while i < len(rest):
            if rest[i] == "\\" and quoted:
                i += 2
                continue
            if rest[i] == '"':
                quoted = not quoted
            elif rest[i] in " \t" and not quoted:
                break
            i += 1
        options, rest = rest[:i], rest[i:].strip()
    parts = rest.split()
    return (options, parts[1]) if len(parts) >= 2 else None


def pinned_machine(options: str) -> str | None:
    """The machine a line's forced `serve --machine` command pins its key to, if any."""
    command = _COMMAND_RE.search(options)
    found = _MACHINE_RE.search(command.group(1)) if command else None
    return found.group(1) if found else None


def forced_command(python: str, launcher: Path, store: Path, machine: str) -> str:
    """The pinned line's command, quoted for the login shell sshd runs it with."""
    words = [python, *PYTHON_FLAGS, str(launcher), "serve", "--store", str(store),
             "--machine", machine]
    for word in words:
        if any(c in word for c in '"\\\n\r'):
            raise InstallError(f"{word!r} contains a quote, backslash or line break, which "
                               "an authorized_keys command cannot carry: install into a "
                               "plainer path (--prefix, --store)")
    return " ".join(shlex.quote(w) for w in words)


def pinned_python(path: Path, key: PublicKey, machine: str, launcher: Path,
                  store: Path) -> str | None:
    """The interpreter of the line that already pins `key` to `machine` with this very command.

    None when there is no such line, or its command differs in more than the interpreter (an
    older prefix, store or flags): an upgrade keeps a working pinned interpreter as it is.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for text in lines:
        parsed = split_line(text)
        if parsed is None or parsed[1] != key.blob or pinned_machine(parsed[0]) != machine:
            continue
        found = _COMMAND_RE.search(parsed[0])
        try:
            words = shlex.split(found.group(1)) if found else []
        except ValueError:
            continue
        if words and found and found.group(1) == _quoted_command(words[0], launcher, store,
                                                                 machine):
            return words[0]
    return None


def _quoted_command(python: str, launcher: Path, store: Path, machine: str) -> str | None:
    try:
        return forced_command(python, launcher, store, machine)
    except InstallError:
        return None


def pinned_line(command: str, key: PublicKey) -> str:
    """One authorized_keys line: no forwarding, no terminal, only `command`."""
    return f'restrict,command="{command}" {key.text}'


def _check_dir(folder: Path, dry_run: bool) -> tuple[list[str], list[str]]:
    """Make ~/.ssh exist with mode 0700, owned by this user, as sshd's StrictModes wants.

    Returns what was done, and warnings about what only the user can fix.
    """
    notes: list[str] = []
    warnings: list[str] = []
    home = folder.parent
    if home.exists() and stat.S_IMODE(home.stat().st_mode) & 0o022:
        warnings.append(f"{home} is group- or world-writable, so sshd's StrictModes will "
                        f"refuse every key: run chmod go-w {home}")
    if not folder.exists():
        if not dry_run:
            folder.mkdir(mode=0o700, parents=True)
            os.chmod(folder, 0o700)
        return [f"created {folder} (mode 0700)"], warnings
    info = folder.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise InstallError(f"{folder} is owned by uid {info.st_uid}, not by this user "
                           f"({os.getuid()}); sshd would ignore it: run the installer as the "
                           "account that logs in, or fix the owner with chown")
    if stat.S_IMODE(info.st_mode) != 0o700:
        if not dry_run:
            os.chmod(folder, 0o700)
        notes.append(f"set {folder} to mode 0700 (was {stat.S_IMODE(info.st_mode):04o})")
    return notes, warnings


def _backup(path: Path) -> Path:
    stamp = utc_now().replace(":", "")
    target = path.with_name(f"{path.name}.bak-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.bak-{stamp}-{n}")
    atomic_write(target, path.read_bytes(), mode=0o600)
    return target


def authorize(path: Path, key: PublicKey, machine: str, command: str, *, repin: bool = False,
              dry_run: bool = False) -> Outcome:
    """Pin `key` to `machine` in `path`: never a second line, never silently moved."""
    line = pinned_line(command, key)
    notes, warnings = _check_dir(path.parent, dry_run)
    try:
        before = path.read_text(encoding="utf-8") if path.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise InstallError(f"cannot read {path}: {exc}; fix or move it aside, then re-run") from None
    lines = before.splitlines()
    same = [i for i, text in enumerate(lines) if (parsed := split_line(text)) and parsed[1] == key.blob]
    for i in same:
        other = pinned_machine(split_line(lines[i])[0])  # type: ignore[index]
        if other != machine and not repin:
            held = (f"pinned to machine {other!r}" if other else
                    "with no machine pin (it may run any command as this account)")
            raise InstallError(
                f"key {key.fingerprint} is already in {path} (line {i + 1}) {held}; a key is "
                f"pinned to one machine only. Give {machine!r} its own key, or move this key "
                f"with: install_server.py --authorize {machine} --key ... --repin")
    if same:
        new_lines = [text for i, text in enumerate(lines) if i not in same[1:]]
        new_lines[same[0]] = line
        action = "unchanged" if lines[same[0]] == line and len(same) == 1 else "updated"
    else:
        new_lines, action = [*lines, line], "added"
    outcome = Outcome(path, action, line, message="; ".join(notes), warnings=warnings)
    if action == "unchanged":
        if not dry_run and path.exists() and stat.S_IMODE(path.stat().st_mode) & 0o077:
            os.chmod(path, 0o600)
        return outcome
    if not dry_run:
        try:
            if path.exists():
                outcome.backup = _backup(path)
            atomic_write(path, ("\n".join(new_lines) + "\n").encode("utf-8"), mode=0o600)
        except OSError as exc:
            raise InstallError(f"cannot write {path}: {exc}; check the folder's owner and "
                               "permissions") from None
    return outcome
