"""What both installers show and how they fail: progress on stderr, a summary on stdout, one error."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from sharedmem.core import ConfigError, SharedMemoryError


class Console:
    """Progress and warnings on stderr, the summary on stdout; counts warnings for the exit code."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.warnings = 0

    def progress(self, message: str) -> None:
        """One progress line on stderr."""
        self.err.write(f"... {message}\n")
        self.err.flush()

    def warn(self, message: str, *, counts: bool = True) -> None:
        """A problem that did not stop the install; it makes the exit status 1 if it `counts`.

        A risk for later, not a fault now (an interpreter that may be removed), does not.
        """
        self.warnings += counts
        self.err.write(f"warning: {message}\n")
        self.err.flush()

    def say(self, text: str) -> None:
        """Summary text on stdout."""
        self.out.write(text.rstrip("\n") + "\n")
        self.out.flush()


class Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of exiting, so one message lists the problem."""

    def error(self, message: str) -> NoReturn:
        """Turn a syntax error into a ConfigError that points at --help."""
        raise ConfigError(f"{message} (see {self.prog} --help)")


def fail_if(problems: list[str], prog: str) -> None:
    """Raise one ConfigError listing every argument problem."""
    if problems:
        listing = "\n  - ".join(problems)
        raise ConfigError(f"{len(problems)} problem(s) with the arguments:\n  - {listing}\n"
                          f"(see {prog} --help)")


def run_main(body: Any, argv: Sequence[str], console: Console, prog: str) -> int:
    """Run an installer body; our errors become one message on stderr and exit status 2."""
    try:
        return int(body(list(argv)))
    except SharedMemoryError as exc:
        console.err.write(f"{prog}: error: {exc}\n")
        return exc.exit_code
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except KeyboardInterrupt:
        console.err.write(f"{prog}: interrupted\n")
        return 130
