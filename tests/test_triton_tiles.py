"""The ``triton`` kernel's complete-graph walk at every tile shape the CUDA autotuner may pick (BLOCK_M {16, 32, 64,
128} x BLOCK_N {16, 32, 64}), run here in Triton's interpreter: the key-block ranges partition the row with the
diagonal and the ragged block only in the masked ranges, and outputs and gradients equal the explicit float64 form
(and the 16 x 16 tiles) whatever the shape. On CUDA the same tests run compiled (the autotuner is bypassed by the
patched block sizes only where it is off: ``UNFOLD_TRITON_AUTOTUNE=0``)."""
from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")

import energies as E  # noqa: E402
from energies.kernels import pairwise_pass  # noqa: E402
from energies.rho import get_rho  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not set", allow_module_level=True)

import triton.language as tl  # noqa: E402

from energies.kernels.triton import pairwise as TP  # noqa: E402
from tests.test_triton import _check, _explicit, _tokens  # noqa: E402


@triton.jit
def _ranges_kernel(OUT, n, live, BM: tl.constexpr, BN: tl.constexpr):
    qb = tl.program_id(0)
    mq = (tl.arange(0, BM) < BM) & (live != 0)          # every query real (live = 1) or none (live = 0)
    lo, hi, full, nkb = TP._key_ranges(qb, n, mq, BM, BN)
    tl.store(OUT + qb * 4 + tl.arange(0, 1), lo + tl.zeros([1], dtype=tl.int32))
    tl.store(OUT + qb * 4 + 1 + tl.arange(0, 1), hi + tl.zeros([1], dtype=tl.int32))
    tl.store(OUT + qb * 4 + 2 + tl.arange(0, 1), full + tl.zeros([1], dtype=tl.int32))
    tl.store(OUT + qb * 4 + 3 + tl.arange(0, 1), nkb + tl.zeros([1], dtype=tl.int32))


@pytest.mark.parametrize("bm, bn", [(16, 16), (32, 16), (16, 32), (64, 32), (32, 64), (128, 32), (128, 64)])
def test_the_key_ranges_partition_the_row_and_mask_every_diagonal_and_ragged_block(bm, bn):
    unmasked_seen = 0
    for n in (1, 5, 16, 31, 64, 97, 200, 257):
        qbs = -(-n // bm)
        out = torch.zeros(qbs * 4, dtype=torch.int32, device=DEVICE)
        dead = torch.zeros(qbs * 4, dtype=torch.int32, device=DEVICE)
        _ranges_kernel[(qbs,)](dead, n, 0, BM=bm, BN=bn)
        assert dead.abs().max().item() == 0           # a block without a real query visits no key block
        _ranges_kernel[(qbs,)](out, n, 1, BM=bm, BN=bn)
        for qb, (lo, hi, full, nkb) in enumerate(out.view(qbs, 4).tolist()):
            unmasked = list(range(0, lo)) + list(range(hi, full))
            masked = list(range(lo, hi)) + list(range(max(hi, full), nkb))
            assert sorted(unmasked + masked) == list(range(-(-n // bn)))            # each key block exactly once
            rows = set(range(qb * bm, min(n, qb * bm + bm)))
            for kb in unmasked:                                                    # no query's own key, none ragged
                cols = set(range(kb * bn, kb * bn + bn))
                assert not cols & rows and max(cols) < n, (n, qb, kb)
            unmasked_seen += len(unmasked)
    assert unmasked_seen > 0           # the unmasked walk is exercised (not everything masked)


@pytest.mark.parametrize("bm, bn", [(16, 16), (32, 16), (16, 32), (64, 32), (32, 64)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_outputs_and_gradients_at_every_tile_shape(bm, bn, dtype, monkeypatch):
    """n = 83 (ragged for every shape), padding at both ends, softplus (both value branches) on the complete graph:
    outputs within the explicit form's rule; gradients equal those of 16 x 16 tiles (float64: to 1e-12)."""
    if DEVICE == "cuda" and TP.AUTOTUNE:
        pytest.skip("on CUDA with autotuning on, the complete graph's tiles are the autotuner's")
    B, n, d, tau = 2, 83, 5, 0.8
    Y, mask = _tokens(B, n, d, dtype, True, seed=bm + bn)
    g = E.complete(n, batch_size=B, mask=mask.cpu()).to(DEVICE)
    rho = get_rho("softplus:1.5:0.5")
    ref = _explicit(Y, g, rho, tau)

    def grads(shape):
        monkeypatch.setattr(TP, "block_size", lambda *a: shape)
        Yk = Y.clone().requires_grad_()
        out = pairwise_pass(Yk, g, rho, tau, "triton", energy=True)
        R = torch.linspace(-1, 1, Yk.numel(), dtype=dtype, device=DEVICE).view_as(Yk)
        ((out.agg * R).sum() + (out.deg * R[..., 0]).sum() + out.energy.sum()).backward()
        return out, Yk.grad

    out, gr = grads((bm, bn))
    _check(out, ref, g, dtype, rho)
    _, g16 = grads((16, 16))
    tol = 1e-12 if dtype == torch.float64 else 1e-4
    assert torch.allclose(gr, g16, rtol=tol, atol=tol * float(g16.abs().max()))


@pytest.mark.parametrize("bm, bn", [(16, 16), (32, 16)])
def test_the_explicit_differences_path_passes_gradcheck(bm, bn, monkeypatch):
    """Clusters 1e4 apart at tau = 1: the guard sends float64 to explicit differences (forward and backward on the
    device, flag = 0); gradcheck of all three outputs. Control: the guard did say explicit."""
    monkeypatch.setattr(TP, "block_size", lambda *a: (bm, bn))
    B, n, d, tau = 2, 20, 3, 1.0
    Y, mask = _tokens(B, n, d, torch.float64, True, seed=4, scale=1e4)
    near, _ = _tokens(B, n, d, torch.float64, False, seed=14)
    Y[:, 1::2] = Y[:, 0:n - 1:2] + near[:, 1::2]
    g = E.complete(n, batch_size=B, mask=mask.cpu()).to(DEVICE)
    rho = get_rho("cauchy")
    Yc = (Y - Y.mean(1, keepdim=True)).double()
    assert not bool(TP.expansion_ok((Yc * Yc).sum(-1), tau, 1.0, torch.float64).any())

    def fn(Y):
        out = pairwise_pass(Y, g, rho, tau, "triton", energy=True)
        return out.agg, out.deg, out.energy

    assert torch.autograd.gradcheck(fn, (Y.requires_grad_(),), eps=1e-4, atol=1e-6, rtol=1e-6, fast_mode=True)
