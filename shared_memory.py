#!/usr/bin/env python3
"""Codex Shared Memory launcher: its path stays stable for existing registrations."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from sharedmem.cli.main import main  # noqa: E402

# Run every two minutes on each machine: once they return, everything is written, committed and
# flushed, and freeing the interpreter's objects one by one would only cost them 10 ms or more.
QUICK_EXIT = ("sync", "serve")

if __name__ == "__main__":
    code = main(sys.argv[1:])
    if sys.argv[1:2] and sys.argv[1] in QUICK_EXIT:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(code)
    sys.exit(code)
