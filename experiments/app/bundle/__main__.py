"""``python -m experiments.app.bundle``: the bundle command line (`experiments.app.bundle.cli.main`)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
