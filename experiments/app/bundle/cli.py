"""The bundle command line: ``python -m experiments.app.bundle convert OLD NEW [--legacy]`` (`main`: `convert`,
printing what it wrote; exit 0, or 2 with one ``error:`` line and nothing written).
"""
from __future__ import annotations

import argparse
import contextlib
import os
from typing import Optional, Sequence

from .conversion import CONVERT_CMD, convert
from .format import VERSION


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m experiments.app.bundle convert OLD NEW [--legacy]``: `convert`, printing what it wrote.
    Exit 0, or 2 with one ``error:`` line and nothing written."""
    from unfold.cli import run_main
    from unfold.plugins import add_import_arg

    p = argparse.ArgumentParser(prog=CONVERT_CMD.rsplit(" ", 1)[0],
                                description="Model bundles: convert a bundle to the current format "
                                            "(model.safetensors + config.json + model card).")
    add_import_arg(p)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="write OLD's model as a format-2 bundle at NEW (OLD is only read)")
    c.add_argument("old", metavar="OLD", help="a bundle of any format (a finished run folder, a saved bundle)")
    c.add_argument("new", metavar="NEW", help="the new bundle's folder (must not exist, or be empty)")
    c.add_argument("--legacy", action="store_true", help="OLD is a run folder from before bundles (no bundle.json)")
    args = p.parse_args(argv)

    def body() -> int:
        with _terminate_as_interrupt():     # a SIGTERM unwinds like Ctrl-C: the staging folder is removed
            out = convert(args.old, args.new, legacy=args.legacy)
        files = sorted(n for n in os.listdir(out) if not n.startswith("."))
        print(f"wrote {out}: {', '.join(files)} (format {VERSION}; {args.old} unchanged)")
        return 0
    return run_main(CONVERT_CMD.rsplit(" ", 1)[0], body, argv)


@contextlib.contextmanager
def _terminate_as_interrupt():
    """Within: SIGTERM raises KeyboardInterrupt (in the main thread), so that a conversion stopped by ``kill`` or a
    job scheduler cleans up as after Ctrl-C; the previous handler is restored after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
