"""``python -m experiments.data fetch|export ...``: the command line of :mod:`experiments.data.cli`."""
import sys

from .cli import main

sys.exit(main())
