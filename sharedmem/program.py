"""Where the program lives and how its server end starts: what launchers and registrations point at."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the release: launcher, package, docs
LAUNCHER = ROOT / "shared_memory.py"
# `serve` needs only the standard library: without `site` its Python starts about 10 ms sooner.
SERVE_PYTHON_FLAGS = ("-S",)
