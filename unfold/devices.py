"""Where a model runs: the one rule of a device spec (``cpu``, ``cuda``, ``cuda:K``, ``auto``) for every command
line flag (``--device``) and config key (``train.device``).

* `resolve_device`: ``auto`` as the device this machine has (``cuda`` where torch sees one, else ``cpu``);
* `parse_device`: a spec's syntax (what a config file may hold, on any machine);
* `check_device`: a spec this machine can run on, before any work.

torch is imported when a function runs, not with this module.
"""
from __future__ import annotations

from energies.errors import UnfoldError

__all__ = ["resolve_device", "parse_device", "check_device"]


def resolve_device(spec):
    """The device ``auto`` stands for on this machine; any other spec as it is.

    Args:
        spec: a device spec (``auto``, ``cpu``, ``cuda``, ``cuda:K``) or a ``torch.device``.

    Returns:
        ``cuda`` where torch sees a CUDA device and ``spec`` is ``auto``, ``cpu`` for ``auto`` without one, else
        ``spec`` unchanged.
    """
    if spec == "auto":
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    return spec


def parse_device(spec, what: str = "--device", error: type = UnfoldError):
    """A device spec's syntax, whatever this machine has: what a config file may name (a run configured for a GPU
    is read on a laptop).

    Args:
        spec: ``cpu``, ``auto`` (resolved, `resolve_device`), or ``cuda[:K]``.
        what: the flag or config key named in the error.
        error: the typed error raised.

    Returns:
        The ``torch.device``.

    Raises:
        UnfoldError: (or ``error``) anything else (``mps``, ``meta``, ``cpu:3``, a typo), naming ``what`` and the
            spec.
    """
    import torch

    spec = resolve_device(spec)
    rule = f"{what} must be cpu, cuda, cuda:K or auto, got {spec!r}"
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError, TypeError):
        raise error(rule) from None
    if device.type not in ("cpu", "cuda"):
        raise error(rule)
    if device.type == "cpu" and device.index not in (None, 0):
        raise error(f"{rule} (there is one cpu device)")
    return device


def check_device(spec, what: str = "--device", error: type = UnfoldError):
    """``spec`` as a device this machine runs the model on, checked before any work.

    Args:
        spec: ``cpu``, ``auto`` (`resolve_device`), or ``cuda[:K]`` (`parse_device`).
        what: the flag or config key named in the error.
        error: the typed error raised.

    Returns:
        The ``torch.device``.

    Raises:
        UnfoldError: (or ``error``) a spec `parse_device` refuses, ``cuda`` without CUDA, or ``cuda:K`` beyond the
            devices this machine has, naming ``what``.
    """
    import torch

    device = parse_device(spec, what, error)
    if device.type == "cuda":
        spec = resolve_device(spec)
        if not torch.cuda.is_available():
            raise error(f"{what} {spec}: CUDA is not available on this machine")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise error(f"{what} {spec}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return device
