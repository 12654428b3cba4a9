#!/usr/bin/env python3
"""Codex Shared Memory launcher: its path stays stable for existing registrations."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharedmem.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
