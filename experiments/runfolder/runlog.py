"""What a training run records as it goes: a log file, ``metrics.csv``, TensorBoard, progress bars.

* `run_logger`, `attach_log_file`: the ``experiments`` `logging` logger writing to stderr and,
  once the run is under way, to ``RUN_DIR/train.log`` (appended, so a resumed run continues its log; a run refused
  at start writes nothing); handlers are removed when the run ends.
* `MetricsLog`: one CSV row per training step (``kind=step``) and per epoch (``kind=epoch``) in
  ``RUN_DIR/metrics.csv`` (columns `COLUMNS`: loss, accuracy, learning rate, energy statistics of the
  step's trace, seconds since the start; validation loss and accuracy on epoch rows), flushed row by row; and
  the same scalars to TensorBoard (``RUN_DIR/tensorboard/``) when the ``tensorboard`` package is installed
  (``pip install 'unfolded-transformers[tb]'``) and ``train.tensorboard`` is true. On resume the rows of the
  epochs after the checkpoint (an epoch cut short) are dropped first, so the file never holds an epoch twice.
* `progress`: a ``tqdm`` bar per epoch on stderr.
"""
from __future__ import annotations

import csv
import errno
import importlib.util
import logging
import logging.handlers
import math
import os
import sys
from typing import Any, Optional

from .atomic import atomic_open, open_append

__all__ = ["run_logger", "attach_log_file", "close_logger", "MetricsLog", "progress", "COLUMNS", "LOGGER", "tensorboard_available"]

LOGGER = "experiments"
LOG_FILE, CSV_FILE, TB_DIR = "train.log", "metrics.csv", "tensorboard"
COLUMNS = ("kind", "epoch", "step", "loss", "accuracy", "lr", "energy_increases", "energy_steps",
           "energy_first_mean", "energy_last_mean", "val_loss", "val_accuracy", "seconds")
_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def run_logger(level: int = logging.INFO) -> logging.Logger:
    """The ``experiments`` logger with a stderr handler (the message alone, as the CLIs print) and an in-memory
    buffer of the records, written to ``train.log`` by `attach_log_file` once the run is under way (a run
    refused before that writes nothing). Call `close_logger` after."""
    log = logging.getLogger(LOGGER)
    close_logger(log)
    log.setLevel(level)
    log.propagate = False
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(console)
    log.addHandler(logging.handlers.MemoryHandler(capacity=1 << 20, flushLevel=logging.CRITICAL + 1))
    return log


class _NoFollowFileHandler(logging.FileHandler):
    """A FileHandler that opens its file by `open_append`: never through a link."""

    def _open(self):
        return open_append(self.baseFilename)


def attach_log_file(run_dir: str) -> None:
    """From now on the ``experiments`` logger also appends to ``run_dir/train.log`` (time-stamped), starting
    with the records buffered since `run_logger`."""
    log = logging.getLogger(LOGGER)
    fh = _NoFollowFileHandler(os.path.join(run_dir, LOG_FILE), encoding="utf-8")
    fh.setFormatter(logging.Formatter(_FORMAT))
    for handler in list(log.handlers):
        if isinstance(handler, logging.handlers.MemoryHandler):
            handler.setTarget(fh)
            handler.flush()
            log.removeHandler(handler)
    log.addHandler(fh)


def close_logger(log: Optional[logging.Logger] = None) -> None:
    """Remove (and close) every handler of the ``experiments`` logger."""
    log = log or logging.getLogger(LOGGER)
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


class MetricsLog:
    """``metrics.csv`` (and TensorBoard) of one run (module docstring). ``resume_after``: the epoch of the
    checkpoint a resumed run continues from (rows of later epochs are dropped); ``None`` for a new run, whose
    file is started afresh."""

    def __init__(self, run_dir: str, tensorboard: bool = True, resume_after: Optional[int] = None,
                 logger: Optional[logging.Logger] = None):
        self.path = os.path.join(run_dir, CSV_FILE)
        kept = self._kept_rows(resume_after) if resume_after is not None else []
        with atomic_open(self.path, "w") as fh:          # the header and the rows kept, replacing what was there
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(COLUMNS)
            w.writerows(kept)
        self._fh = open_append(self.path)
        self._csv = csv.writer(self._fh, lineterminator="\n")
        self.tb = None
        if tensorboard:
            if tensorboard_available():
                from torch.utils.tensorboard import SummaryWriter

                if os.path.islink(os.path.join(run_dir, TB_DIR)):
                    raise OSError(errno.ELOOP, "is a symbolic link, which the project never writes through",
                                  os.path.join(run_dir, TB_DIR))

                self.tb = SummaryWriter(os.path.join(run_dir, TB_DIR))
            elif logger is not None:
                logger.info("tensorboard is not installed (pip install 'unfolded-transformers[tb]'): "
                            "metrics go to metrics.csv only")

    def _kept_rows(self, resume_after: int) -> list:
        try:
            with open(self.path, encoding="utf-8", newline="") as fh:
                rows = list(csv.reader(fh))
        except OSError:
            return []
        if not rows or tuple(rows[0]) != COLUMNS:
            return []
        return [r for r in rows[1:] if len(r) == len(COLUMNS) and r[1].isdigit() and int(r[1]) <= resume_after]

    def write(self, kind: str, epoch: int, step: int, **values: Any) -> None:
        """One row: ``kind`` (step | epoch), the epoch, the global step, and the named `COLUMNS` values."""
        unknown = set(values) - set(COLUMNS)
        if unknown:
            raise KeyError(f"metrics.csv has no column(s) {sorted(unknown)}")
        row = {"kind": kind, "epoch": epoch, "step": step, **values}
        self._csv.writerow([_cell(row.get(c)) for c in COLUMNS])
        self._fh.flush()
        if self.tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and key != "seconds":
                    self.tb.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def progress(total: int, label: str, enabled: bool = True):
    """A ``tqdm`` bar of ``total`` steps on stderr (updated at most every 2 s when stderr is not a terminal)."""
    from tqdm.auto import tqdm

    tty = sys.stderr.isatty()
    return tqdm(total=total, desc=label, disable=not enabled, file=sys.stderr, leave=tty,
                mininterval=0.1 if tty else 2.0, dynamic_ncols=True)


def read_metrics_csv(path: str) -> list:
    """The rows of a ``metrics.csv`` as dicts (numbers as floats, empty cells as ``None``)."""
    with open(path, encoding="utf-8", newline="") as fh:
        return [{k: (None if v == "" else (v if k == "kind" else float(v))) for k, v in row.items()}
                for row in csv.DictReader(fh)]
