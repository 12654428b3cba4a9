#!/usr/bin/env python3
"""Install Codex Shared Memory on the server (see docs/INSTALL.md, or run with --help)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharedmem.install.server_install import server_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(server_main(sys.argv[1:]))
