#!/usr/bin/env python3
"""Install Codex Shared Memory on a client (see docs/INSTALL.md, or run with --help)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sharedmem.install.client_install import client_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(client_main(sys.argv[1:]))
