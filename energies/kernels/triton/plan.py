"""The ``triton`` kernel's plan for a shift-invariant graph: whether to split it into a band and the complete graph
of each residue class. A module of its own, imported when the kernel runs: the plan is marked a constant for
``torch.compile``, and the mark imports ``torch._dynamo`` (seconds), which importing the library should not pay."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ...graphs.bands import banded_plan

__all__ = ["residue_split"]


@torch.compiler.assume_constant_result
def residue_split(offsets: Tuple[int, ...], n: int) -> Optional[Tuple[Tuple[int, ...], int]]:
    """``(band offsets, stride k)`` when the graph of ``offsets`` on n tokens is cheaper as a band plus the complete
    graph of each residue class mod k (`banded_plan`: fewer keys per query than n),
    else None. The tiled kernel visits every key block a query block's offsets reach: every multiple of k is an
    offset of ``strided:k``, so unsplit it visits every block (as slow as the complete graph), split
    ``n / k + b + 2(k - 1)`` keys per query."""
    keys, band, k = banded_plan(tuple(offsets), n)
    return (band, k) if k is not None and keys < n else None
