"""The one memory rule: a request's size is estimated in bytes and compared with what this process may still
allocate *before* anything is allocated or written; a request that cannot fit is refused with the caller's typed
error, naming the sizes that make it (option or parameter and value), the estimate and what is available -- never
left to the allocator's untyped error halfway through (or to swap).

Used by the graph builders and [`edges`][energies.TokenGraph.edges] (edge lists), the ``dense``
kernel (``B x n x n`` matrices), the encoders (their weights), ``unfold-check`` (tokens, edges, dense matrices)
and the application (training's weights and optimiser state, ``unfold-data export`` of generated data). The
estimates are lower bounds of the peak (temporaries come on top), so a refusal is never wrong; a request just below
the line may still fail in the allocator, whose error the callers that can (training) report as well.

Layer: [`energies`][energies] (imports nothing of the project), so every layer above may use it.
"""
from __future__ import annotations

import os
from typing import Optional, Type


def memory_available() -> Optional[int]:
    """Bytes this process may still allocate on the host: the smaller of the address-space limit
    (``ulimit -v``) less what is mapped now, and the system's available memory (``/proc/meminfo``); None where
    neither can be read."""
    limits = []
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as fh:
                mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            limits.append(soft - mapped)
    except (ImportError, OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return min(limits) if limits else None


def format_bytes(n: float) -> str:
    """``n`` bytes for a message: GiB with two decimals (MiB below 0.1 GiB; any size, 1e30 included)."""
    n = max(float(n), 0.0)
    return f"{n / 2 ** 30:,.2f} GiB" if n >= 0.1 * 2 ** 30 else f"{n / 2 ** 20:,.1f} MiB"


#: requests below this many bytes are not read against the system (a reading costs two file reads; the hot paths,
#: a dense pass on a small n, call the rule on every layer)
MIN_CHECKED = 2 ** 26


def check_memory(need: float, what: str, error: Type[Exception], hint: str = "", device=None) -> None:
    """Refuse (``error(message)``) a request of about ``need`` bytes of host memory that this process cannot
    allocate (`memory_available`). ``what`` names the request by its sizes (``"--samples 1000000 x --n 10
    x --d 10 float64 tokens"``), ``hint`` says what to change. Requests on a device other than the CPU (``device``
    given and not ``cpu``/``meta``) are not judged here; a ``meta`` request allocates nothing and passes too, and so
    does one below `MIN_CHECKED` bytes."""
    if need < MIN_CHECKED or (device is not None and getattr(device, "type", str(device)) != "cpu"):
        return
    import torch

    if torch.compiler.is_compiling():        # inside a traced graph: no file reads (the eager call checked)
        return
    free = memory_available()
    if free is not None and need > free:
        raise error(f"{what} needs about {format_bytes(need)} of memory, and this process may allocate "
                    f"{format_bytes(free)} (memory limit or available memory){'; ' + hint if hint else ''}")
