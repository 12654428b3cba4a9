#!/usr/bin/env python3
"""Codex Shared Memory launcher: its path stays stable for existing registrations."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from sharedmem.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
