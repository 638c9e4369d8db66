"""ReLU kinks that a spline probe can see and freeze.

Piecewise-polynomial maps in this framework have kinks in places that are not ``nn.ReLU``
modules: the ReLU kernel ``max(c - z, 0)`` of the truncated-quadratic rho and the ReLU prox
(projection onto Y >= 0) of the MM steps. They call :func:`relu` here. Outside a :func:`tape` it is
``torch.relu``. Inside ``tape()`` every call records the sign pattern of its input (in call order);
inside ``tape(replay=patterns)`` every call applies the given pattern instead,
``where(pattern, x, 0)``: the map with its pieces frozen, linear at every kink, which
:mod:`experiments.spline_probe` uses to check that a piece is a polynomial beyond its own interval.
``nn.ReLU`` modules join the same tape through forward hooks (:meth:`KinkTape.hook`).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List, Optional, Sequence

import torch

__all__ = ["relu", "tape", "paused", "KinkTape"]


class KinkTape:
    """Records sign patterns (``replay=None``) or replays given ones, one per ReLU call, in order."""

    def __init__(self, replay: Optional[Sequence[torch.Tensor]] = None):
        self.signs: List[torch.Tensor] = []
        self.replay = None if replay is None else list(replay)
        self.pos = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.replay is None:
            self.signs.append((x > 0).reshape(-1).detach().cpu())
            return torch.relu(x)
        if self.pos >= len(self.replay) or self.replay[self.pos].numel() != x.numel():
            raise RuntimeError(f"kink tape out of step at ReLU call {self.pos}: the replayed map evaluates "
                               "different ReLUs than the recorded one")
        pattern = self.replay[self.pos].reshape(x.shape).to(x.device)
        self.pos += 1
        return torch.where(pattern, x, torch.zeros((), dtype=x.dtype, device=x.device))

    def hook(self, module, inputs, output):
        """Forward hook for ``nn.ReLU``: the module's output goes through the tape."""
        return self(inputs[0])

    def pattern(self) -> torch.Tensor:
        """All recorded signs, concatenated (empty when no ReLU ran)."""
        return torch.cat(self.signs) if self.signs else torch.zeros(0, dtype=torch.bool)


_TAPES: List[KinkTape] = []


def relu(x: torch.Tensor) -> torch.Tensor:
    """``max(x, 0)``, or the innermost active :func:`tape`'s record / replay of it."""
    return _TAPES[-1](x) if _TAPES else torch.relu(x)


@contextmanager
def tape(replay: Optional[Sequence[torch.Tensor]] = None) -> Iterator[KinkTape]:
    """Record (or replay) every :func:`relu` evaluated inside the block."""
    t = KinkTape(replay)
    _TAPES.append(t)
    try:
        yield t
    finally:
        _TAPES.remove(t)


@contextmanager
def paused() -> Iterator[None]:
    """Evaluate without any tape (for checks that are not part of the map, e.g. validating a rho)."""
    saved = _TAPES[:]
    _TAPES.clear()
    try:
        yield
    finally:
        _TAPES[:] = saved
