"""How a shift-invariant graph's offsets are laid out in blocks: the band (block size and keys per query) and the
residue classes of a stride (:func:`banded_plan`). Plain arithmetic on the offsets, shared by the CPU's ``banded``
kernel (:mod:`energies.banded`) and the GPU's ``triton`` kernel (:mod:`energies.kernels.triton_kernel`)."""
from __future__ import annotations

import functools
from typing import Optional, Tuple

__all__ = ["BANDED_ALIGN", "BANDED_MIN_BLOCK", "banded_block", "band_width", "banded_plan"]

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
