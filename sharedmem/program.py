"""Where the program lives and how its server end starts: what launchers and registrations point at."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the release: launcher, package, docs
LAUNCHER = ROOT / "shared_memory.py"
# How every command the installers write starts Python (`serve`, the scheduled `sync`, the
# harnesses' `mcp`): each needs only the standard library, and without `site` Python starts
# sooner, most where site-packages holds `.pth` files that import.
PYTHON_FLAGS = ("-S",)
