"""Fused softmax attention with a differentiable log-sum-exp: the one wrapper of PyTorch's private
flash-attention op.

``fused_attention(q, k, v, scale)`` returns ``(O, LSE)`` for ``(..., n, c)`` inputs,

    LSE_u = log sum_v exp(scale q_u.k_v),      O_u = sum_v exp(scale q_u.k_v - LSE_u) v_v,

without materialising the ``n x n`` matrix, in one kernel call forward and one backward. The op
(``aten._scaled_dot_product_flash_attention_for_cpu``) returns the LSE but gives it no gradient;
the backward here supplies it with the op's own backward. Its backward forms
``dS_uv = p_uv (g_u.v_v - delta_u)`` with ``delta_u = g_u.O_u`` read from the ``out`` it is given.
The LSE gradient adds ``p_uv lam_u`` to ``dS_uv``; appending one column to every operand, zero to
q, k, v, one to ``g`` and ``-lam`` to ``out``, turns delta into ``delta_u - lam_u`` and leaves
everything else unchanged, so a single backward call yields the gradients of both outputs.

The op runs on CPU only (float32 / float64 / bfloat16). Private ops can change between releases:
:func:`fused_available` probes the op once, and the tests compare both outputs and all gradients
with the explicit computation.
"""
from __future__ import annotations

from typing import Dict

import torch

from .errors import EnergyError

__all__ = ["fused_attention", "fused_available"]


def _ops():
    aten = torch.ops.aten
    return aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention_for_cpu_backward


_AVAILABLE: Dict[str, bool] = {}


@torch.compiler.assume_constant_result
def fused_available(device_type: str = "cpu") -> bool:
    """Whether the fused op exists and agrees with the explicit form on a small case (probed once per process;
    a constant to ``torch.compile``, which does not trace the probe)."""
    if device_type not in _AVAILABLE:
        _AVAILABLE[device_type] = device_type == "cpu" and _probe()
    return _AVAILABLE[device_type]


def _probe() -> bool:
    """Run the op once on CPU tensors -- made explicitly on the CPU: under a ``torch.device("meta")`` context (the
    trainer's build check) a tensor made here would be a meta tensor, the probe would fail, and the op would be
    taken as missing for the rest of the process (as it once was, by every training run)."""
    try:
        fwd, _ = _ops()
        q = torch.randn(1, 1, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0), device="cpu")
        o, lse = fwd(q, q, q, scale=0.7)
        s = q @ q.transpose(-1, -2) * 0.7
        return bool(torch.allclose(lse, torch.logsumexp(s, -1)) and torch.allclose(o, torch.softmax(s, -1) @ q))
    except (RuntimeError, AttributeError):
        return False


def _pad(t: torch.Tensor, value: float) -> torch.Tensor:
    return torch.cat([t, torch.full_like(t[..., :1], value)], -1)


class _FusedAttention(torch.autograd.Function):
    """``v=None``: the values are the queries (passed once: dynamo refuses one tensor as two inputs)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, spare):
        fwd, _ = _ops()
        v_is_q = v is None
        v = q if v_is_q else v
        cut = (lambda t: t[..., :-1]) if spare else (lambda t: t)
        o, lse = fwd(cut(q), cut(k), cut(v), scale=scale)     # strided views: the op reads them in place
        ctx.save_for_backward(q, k, o, lse) if v_is_q else ctx.save_for_backward(q, k, o, lse, v)
        ctx.scale, ctx.v_is_q, ctx.spare = scale, v_is_q, spare
        return o, lse

    @staticmethod
    def backward(ctx, g_o, g_lse):
        q, k, o, lse, *rest = ctx.saved_tensors
        v = q if ctx.v_is_q else rest[0]
        _, bwd = _ops()
        g_o = torch.zeros_like(o) if g_o is None else g_o.contiguous()
        if g_lse is None:
            cut = (lambda t: t[..., :-1]) if ctx.spare else (lambda t: t)
            dq, dk, dv = bwd(g_o, cut(q), cut(k), cut(v), o, lse, 0.0, False, scale=ctx.scale)
            if ctx.spare:
                dq, dk, dv = (torch.nn.functional.pad(g, (0, 1)) for g in (dq, dk, dv))
        else:
            out = torch.cat([o, -g_lse[..., None].to(o.dtype)], -1)
            if ctx.spare:                              # the inputs already carry the zero column
                qp, kp, vp = q, k, v
            else:
                qp, kp = _pad(q, 0.0), _pad(k, 0.0)
                vp = qp if ctx.v_is_q else _pad(v, 0.0)    # values given as the queries: padded once
            dq, dk, dv = bwd(_pad(g_o, 1.0), qp, kp, vp, out, lse, 0.0, False, scale=ctx.scale)
            if ctx.spare:                              # the spare column is not read by the forward: no gradient
                dv[..., -1] = 0.0
            else:
                dq, dk, dv = dq[..., :-1], dk[..., :-1], dv[..., :-1]
        if ctx.v_is_q:
            return dq + dv, dk, None, None, None
        return dq, dk, dv, None, None


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, spare: bool = False):
    """``(O, LSE)`` of softmax attention, both differentiable (see the module docstring).

    Shapes ``(B, H, n, c)`` for q, k, v (one head size c); returns ``O (B, H, n, c)`` and
    ``LSE (B, H, n)``. ``spare=True``: q, k, v come with ``c + 1`` columns whose last one is zero (the caller
    built them so); the op reads the first c in place and the backward uses the zero column for the LSE
    gradient instead of copying the three inputs once more. ``v`` may be ``q`` itself."""
    if not fused_available(q.device.type):
        raise EnergyError(f"the fused kernel needs PyTorch's CPU flash-attention op; tokens are on "
                          f"{q.device.type!r} (use kernel 'softmax' or 'streamed' there)")
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1]) or (spare and q.shape[-1] < 2):
        raise EnergyError(f"fused attention needs one head size, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                          f"v {tuple(v.shape)}")
    shared = v is q
    q = q.contiguous()
    return _FusedAttention.apply(q, k.contiguous(), None if shared else v.contiguous(), float(scale), bool(spare))
