"""Training throughput and peak memory of a run, as ``metrics.json`` reports them.

Each epoch the trainer measures its training passes only (forward, loss, backward, optimizer step: the batch
loop, not the validation or the checkpoint that follow) with a `PassMeter`, and stores four numbers in
the epoch's ``history`` record (`HISTORY_FIELDS`):

* ``train_tokens``: real tokens (the padding mask's ``True`` entries, summed over the ranks of a distributed
  run) that went through the training passes;
* ``train_pass_seconds``: wall time of that batch loop (on CUDA, synchronised at its end);
* ``peak_memory_bytes``: the peak during that batch loop. On CUDA ``torch.cuda.max_memory_allocated`` (the
  caching allocator's peak of tensor memory, reset at the epoch's start). On the CPU the process's peak resident
  set during the loop: Linux's high-water mark ``VmHWM`` is reset to the current resident set at the epoch's
  start (``/proc/self/clear_refs`` ``5``) and read at its end, so the figure leaves out what data loading and
  the untrained descent check held before training, but includes everything resident meanwhile (the Python
  interpreter and torch's libraries, about 0.3-0.5 GB, the data, the weights). Where the reset is not
  available, the process's peak since it started (``resource.getrusage(...).ru_maxrss``) stands in;
  ``peak_memory_kind`` in the metrics says which;
* ``peak_memory_growth_bytes``: that peak less what was in use at the epoch's start (the allocated tensors on
  CUDA, the resident set on the CPU): the memory the training step itself added (activations, gradients,
  and in the first epoch the optimizer's moments), the figure that compares models on one machine.

`run_metrics` turns the history into the run's figures: ``train_tokens_per_second`` = total tokens /
total pass seconds, and the largest peaks over the epochs. Because the figures live in the per-epoch records, a
resumed run keeps those of the epochs before the interruption (they are in the checkpoint's history, each
measured by the process that trained it); records written before these fields existed are left out, and
``throughput_epochs`` counts the epochs the figures cover (``None`` figures when no epoch has them).
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..runfolder.checkpoint_fields import THROUGHPUT_KEYS

#: the fields a `PassMeter` adds to each epoch's history record (checked when a checkpoint is read)
HISTORY_FIELDS = THROUGHPUT_KEYS

CUDA_KIND = "cuda max_memory_allocated during the training passes"
HWM_KIND = "cpu peak resident set (VmHWM) during the training passes, whole process"
RUSAGE_KIND = "cpu peak resident set (ru_maxrss) of the whole process since it started"


def _status_bytes(field: str) -> Optional[int]:
    """``field`` (``VmHWM``, ``VmRSS``) of ``/proc/self/status`` in bytes, or ``None``."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_hwm() -> bool:
    """Reset this process's peak resident set to its current one (Linux >= 4.0); whether it worked."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return _status_bytes("VmHWM") is not None
    except OSError:
        return False


def _rusage_bytes() -> int:
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024     # bytes on macOS, KiB on Linux


def memory_kind(device: torch.device) -> str:
    """What ``peak_memory_bytes`` measures on ``device`` in this process (module docstring)."""
    if device.type == "cuda":
        return CUDA_KIND
    return HWM_KIND if _reset_hwm() else RUSAGE_KIND


class PassMeter:
    """Time and peak memory of one epoch's training passes: `start` before the batch loop, `stop`
    after it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.t0 = 0.0
        self.base = 0
        self.hwm = False

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self.hwm = _reset_hwm()
            self.base = _status_bytes("VmRSS") or 0
        self.t0 = time.perf_counter()

    def stop(self) -> Tuple[float, int, int]:
        """``(seconds, peak_bytes, growth_bytes)`` since `start`."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            seconds = time.perf_counter() - self.t0
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            seconds = time.perf_counter() - self.t0
            peak = (_status_bytes("VmHWM") if self.hwm else None) or _rusage_bytes()
        return seconds, int(peak), max(int(peak) - self.base, 0)

    def record(self, tokens: int) -> Dict[str, Any]:
        """The history fields of the epoch (`HISTORY_FIELDS`) after `stop`-ing."""
        seconds, peak, growth = self.stop()
        return {"train_tokens": int(tokens), "train_pass_seconds": seconds, "peak_memory_bytes": peak,
                "peak_memory_growth_bytes": growth}


def run_metrics(history: List[Dict[str, Any]], device: torch.device) -> Dict[str, Any]:
    """The run's throughput and memory figures from its epochs' records (module docstring)."""
    recs = [r for r in history if all(k in r for k in HISTORY_FIELDS)]
    tokens = sum(int(r["train_tokens"]) for r in recs)
    seconds = sum(float(r["train_pass_seconds"]) for r in recs)
    return {"train_tokens": tokens if recs else None, "train_pass_seconds": seconds if recs else None,
            "train_tokens_per_second": tokens / seconds if recs and seconds > 0 else None,
            "peak_memory_bytes": max((int(r["peak_memory_bytes"]) for r in recs), default=None),
            "peak_memory_growth_bytes": max((int(r["peak_memory_growth_bytes"]) for r in recs), default=None),
            "peak_memory_kind": memory_kind(device), "throughput_epochs": len(recs)}
