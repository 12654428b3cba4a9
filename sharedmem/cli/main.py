"""The command line: one builder and one handler per command; the only place errors become exit codes.

Handlers import what they need when they run, so `mcp` starts without loading the rest.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

def parser(command: str | None = None) -> Any:
    """The argparse tree; a function so the docs test can walk every command and option.

    With `command`, the one named so by its builder (`build_<command>`) is all the tree holds
    when there is one: a sync run every two minutes does not build twenty other commands.
    """
    import argparse

    from sharedmem import __version__
    top = argparse.ArgumentParser(
        prog="shared_memory.py",
        description="Codex Shared Memory: share allowlisted Markdown memory across machines and "
        "coding-agent harnesses. See README.md and docs/.")
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from sharedmem.cli import check_commands, client_commands, history_commands, server_commands
    doctor, demo = check_commands.BUILDERS
    serve, *store = server_commands.BUILDERS
    builders = (serve, *client_commands.BUILDERS, doctor, *store, *history_commands.BUILDERS,
                demo)
    named = [b for b in builders if b.__name__ == f"build_{command}"]
    for build in named or builders:
        build(sub)
    return top


def main(argv: Sequence[str]) -> int:
    """Run one command; our errors become a message on stderr and a non-zero exit status."""
    argv = list(argv)
    if len(argv) == 3 and argv[0] == "mcp" and argv[1] == "--config":
        from sharedmem.mcp import server
        return server.main(argv[2])
    if argv[:1] == ["sync"] and "--config" in argv[:-1]:
        from sharedmem.client import early_ssh  # ssh's handshake overlaps loading the rest
        early_ssh.start(argv[argv.index("--config") + 1])
    try:
        if argv[:1] != ["sync"] and argv[:1] != ["serve"]:
            return _run(argv)
        # Their run pauses the collector (`collector.Paused`), and so do the imports before it:
        # the collections a hundred modules' objects set off would free nothing.
        from sharedmem import collector
        with collector.Paused():
            return _run(argv)
    finally:
        if "sharedmem.client.early_ssh" in sys.modules:
            sys.modules["sharedmem.client.early_ssh"].discard()


def _quick_args(argv: list[str]) -> Any:
    """The commands the installers write, parsed without loading argparse.

    `serve --store S [--machine M]`, as forced commands run it, and `sync --config C [--json]`,
    as the schedule runs it. Anything else (other options, help, a missing value) gives None
    and goes to argparse.
    """
    if argv[:2] == ["sync", "--config"] and len(argv) in (3, 4) and not argv[2].startswith(
            "-") and argv[3:] in ([], ["--json"]):
        from sharedmem.cli.client_commands import run_sync
        from sharedmem.client.lock import DEFAULT_WAIT
        return _Args(command="sync", handler=run_sync, config=argv[2], json=len(argv) == 4,
                     max_protocol=3, compress=None, wait=DEFAULT_WAIT, notes_only=False,
                     index=False)
    if argv[:2] != ["serve", "--store"] or len(argv) not in (3, 5) or any(
            a.startswith("-") for a in argv[2::2]) or len(argv) == 5 and argv[3] != "--machine":
        return None
    from sharedmem.cli.server_commands import run_serve
    return _Args(command="serve", handler=run_serve, store=argv[2],
                 machine=argv[4] if len(argv) == 5 else None, max_protocol=3)


class _Args:
    """The parsed arguments of a command parsed without argparse."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def _run(argv: list[str]) -> int:
    from sharedmem.core import SharedMemoryError
    args = _quick_args(argv) or parser(argv[0] if argv else None).parse_args(argv)
    try:
        return args.handler(args)
    except SharedMemoryError as exc:
        from sharedmem.cli.output import shown  # the message may quote what a peer sent
        print(f"shared_memory.py {args.command}: error: {shown(exc, lines=True)}",
              file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
