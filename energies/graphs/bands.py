"""How a shift-invariant graph's offsets are laid out in blocks: the band (block size and keys per query) and the
residue classes of a stride (`banded_plan`), and the tokens regrouped by residue class and back
(`to_classes`, `from_classes`, `class_mask`). Shared by the CPU's ``banded`` kernel
(`energies.kernels.banded`) and the GPU's ``triton`` kernel (`energies.kernels.triton`)."""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

__all__ = ["BANDED_ALIGN", "BANDED_MIN_BLOCK", "banded_block", "band_width", "banded_plan", "class_mask",
           "from_classes", "to_classes"]

#: the block size is a multiple of this
BANDED_ALIGN = 8
#: the smallest block (8, 16 and 32 measured within 10 % of each other on window:8, n = 512)
BANDED_MIN_BLOCK = 8


def banded_block(reach: int, n: int) -> int:
    """Block size b for offsets reaching ``reach``: the multiple of ``BANDED_ALIGN`` at least ``reach`` and
    ``BANDED_MIN_BLOCK``, and no more than n rounded up (one block covers a short sequence)."""
    b = max(reach, BANDED_MIN_BLOCK)
    b = -(-b // BANDED_ALIGN) * BANDED_ALIGN
    return min(b, -(-n // BANDED_ALIGN) * BANDED_ALIGN)


def band_width(offsets: Tuple[int, ...], n: int) -> int:
    """Keys per query of the band layout of ``offsets``: ``b + 2R`` (0 without offsets)."""
    if not offsets:
        return 0
    reach = max(offsets)
    return banded_block(reach, n) + 2 * reach


@functools.lru_cache(maxsize=256)
def banded_plan(offsets: Tuple[int, ...], n: int) -> Tuple[int, Tuple[int, ...], Optional[int]]:
    """``(keys per query, band offsets, stride k or None)``: the cheapest split of ``offsets`` into a band and one
    residue layout. A stride ``k`` qualifies when every multiple of k below n is an offset; its pairs are then
    those of the complete graph within each residue class ``i mod k`` (``ceil(n / k)`` keys per query), and the
    other offsets (not multiples of k) go to the band. The plain band (no stride) is a candidate too; ties keep
    it. A strided graph ``strided:k`` (offsets ``1..k-1`` and every multiple of k) costs ``b + 2(k-1) + n / k``
    keys per query instead of ``n``."""
    best = (band_width(offsets, n), offsets, None)
    have = set(offsets)
    for k in offsets:
        if all(m in have for m in range(k, n, k)):
            rest = tuple(o for o in offsets if o % k)
            cost = band_width(rest, n) + -(-n // k)
            if cost < best[0]:
                best = (cost, rest, k)
    return best


def class_mask(mask: torch.Tensor, k: int) -> torch.Tensor:
    """``(B k, m)``: the token mask of each residue class ``i mod k`` of each example (row ``b k + r``: tokens
    ``r, r + k, ...``), padded with False to ``m = ceil(n / k)``."""
    B, n = mask.shape
    m = -(-n // k)
    return torch.nn.functional.pad(mask, (0, m * k - n)).reshape(B, m, k).transpose(1, 2).reshape(B * k, m)


def to_classes(t: torch.Tensor, k: int) -> torch.Tensor:
    """``(B, H, n, ...) -> (B k, H, m, ...)``: row ``b k + r`` holds the tokens ``r, r + k, ...`` of example b
    (residue class r), padded with zeros to ``m = ceil(n / k)``; rows as in `class_mask`."""
    B, H, n = t.shape[:3]
    m = -(-n // k)
    t = torch.nn.functional.pad(t, (0, 0) * (t.ndim - 3) + (0, m * k - n))
    t = t.reshape(B, H, m, k, *t.shape[3:]).movedim(3, 1)
    return t.reshape(B * k, H, m, *t.shape[4:])


def from_classes(t: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """The inverse of `to_classes`: ``(B k, H, m, ...) -> (B, H, n, ...)`` (the padding dropped)."""
    Bk, H, m = t.shape[:3]
    t = t.reshape(Bk // k, k, H, m, *t.shape[3:]).movedim(1, 3)
    return t.reshape(Bk // k, H, m * k, *t.shape[4:])[:, :, :n]
