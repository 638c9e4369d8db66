"""Fused softmax attention with a differentiable log-sum-exp: the one wrapper of PyTorch's private fused-attention
ops (the CPU flash op; on CUDA the memory-efficient op for float32 and the flash op for bfloat16 / float16).

``fused_attention(q, k, v, scale)`` returns ``(O, LSE)`` for ``(..., n, c)`` inputs,

    LSE_u = log sum_v exp(scale q_u.k_v),      O_u = sum_v exp(scale q_u.k_v - LSE_u) v_v,

without materialising the ``n x n`` matrix, in one kernel call forward and one backward. The ops return the LSE
but give it no gradient; the backward here supplies it with the op's own backward. Every one of these backwards
(the CPU flash op, CUTLASS's memory-efficient kernel, FlashAttention-2) forms ``dS_uv = p_uv (g_u.v_v - delta_u)``
with ``delta_u = g_u.O_u`` computed from the ``out`` it is given. The LSE gradient adds ``p_uv lam_u`` to
``dS_uv``; a column j in which every value ``v_vj`` is 0, with ``g_uj = 1`` and ``out_uj = -lam_u``, turns delta
into ``delta_u - lam_u`` and leaves ``g_u.v_v`` unchanged, so a single backward call yields the gradients of both
outputs. That column is appended (zero in q, k, v) unless the caller's layout has one (``spare``: the last column
is zero in q, k and v; ``lse_col=j``: the values' column j is zero, q and k may hold anything there).

Which op serves which tensors: `fused_ops` (probed once per device type and dtype, the reason kept when one
is missing). Private ops can change between releases: the probe compares each op with the explicit form on a
small case before it is used (on ``meta``, which stands in for a GPU in the tests, the shapes only), and the tests
compare both outputs and all gradients with the explicit computation -- the CUDA ops' calling convention through
their meta kernels, their algebra through `REFERENCE_OPS`, a plain-torch op with the same contract.
"""
from __future__ import annotations

import sys
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import torch

from ..errors import EnergyError

__all__ = ["constant_for_compile", "fused_attention", "fused_available", "fused_ops", "fused_ops_for_head",
           "fused_unavailable", "FusedOps", "REFERENCE_OPS"]


class FusedOps(NamedTuple):
    """One fused-attention op pair. ``forward(q, k, v, scale) -> (O, LSE, state)`` on ``(B, H, n, c)`` inputs (LSE
    at least n long in its last axis: the memory-efficient op pads it to a multiple of 32; ``state`` what the
    backward needs besides); ``backward(g, q, k, v, out, lse, state, scale) -> (dq, dk, dv)`` forming
    ``delta = rowsum(g * out)`` from ``out`` (see the module docstring); ``head_multiple``: the head size the op
    wants a multiple of (the caller's layout pads with zero columns); ``arithmetic``: what its products are;
    ``max_head``: the largest head size its kernels take (None: any; see `fused_ops_for_head`)."""
    name: str
    forward: Callable
    backward: Callable
    head_multiple: int
    arithmetic: str
    max_head: Optional[int] = None


def _aten():
    return torch.ops.aten


def _cpu_forward(q, k, v, scale):
    o, lse = _aten()._scaled_dot_product_flash_attention_for_cpu(q, k, v, scale=scale)
    return o, lse, ()


def _cpu_backward(g, q, k, v, out, lse, state, scale):
    return _aten()._scaled_dot_product_flash_attention_for_cpu_backward(g, q, k, v, out, lse, 0.0, False,
                                                                        scale=scale)


def _efficient_forward(q, k, v, scale):
    o, lse, seed, offset = _aten()._scaled_dot_product_efficient_attention(q, k, v, None, True, scale=scale)
    return o, lse, (seed, offset)


def _efficient_backward(g, q, k, v, out, lse, state, scale):
    dq, dk, dv, _ = _aten()._scaled_dot_product_efficient_attention_backward(
        g, q, k, v, None, out, lse, state[0], state[1], 0.0, [True, True, True, False], scale=scale)
    return dq, dk, dv


def _flash_forward(q, k, v, scale):
    o, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = _aten()._scaled_dot_product_flash_attention(
        q, k, v, 0.0, False, False, scale=scale)
    return o, lse, (cum_q, cum_k, max_q, max_k, seed, offset)


def _flash_backward(g, q, k, v, out, lse, state, scale):
    cum_q, cum_k, max_q, max_k, seed, offset = state
    return _aten()._scaled_dot_product_flash_attention_backward(g, q, k, v, out, lse, cum_q, cum_k, max_q, max_k,
                                                                0.0, False, seed, offset, scale=scale)


def _reference_forward(q, k, v, scale):
    """Plain torch with the CUDA ops' contract (LSE padded to a multiple of 32 like the memory-efficient op's)."""
    s = (q @ k.transpose(-1, -2)).to(torch.float32 if q.dtype != torch.float64 else q.dtype) * scale
    lse = torch.logsumexp(s, -1)
    o = (torch.exp(s - lse[..., None]).to(v.dtype) @ v)
    n = lse.shape[-1]
    return o, torch.nn.functional.pad(lse, (0, -n % 32), value=float("inf")), ()


def _reference_backward(g, q, k, v, out, lse, state, scale):
    """The backward every fused op implements: ``delta = rowsum(g * out)``, ``dS = P (g V^T - delta)``."""
    n = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * scale
    p = torch.exp(s - lse[..., :n, None].to(s.dtype))
    delta = (g * out).sum(-1, keepdim=True)
    ds = p * (g @ v.transpose(-1, -2) - delta)
    return ds @ k * scale, ds.transpose(-1, -2) @ q * scale, p.transpose(-1, -2) @ g


CPU_OPS = FusedOps("cpu-flash", _cpu_forward, _cpu_backward, 1, "the CPU flash op, products in the input dtype")
EFFICIENT_OPS = FusedOps("cuda-memory-efficient", _efficient_forward, _efficient_backward, 8,
                         "CUTLASS memory-efficient attention: float32 on tensor cores with the 3xTF32 split "
                         "(float32-level products), float32 accumulation")
FLASH_OPS = FusedOps("cuda-flash", _flash_forward, _flash_backward, 8,
                     "FlashAttention-2: bfloat16/float16 products, float32 accumulation and log-sum-exp",
                     max_head=256)     # flash_api.cpp, mha_fwd / mha_bwd: "head dimension at most 256"
#: the algebra of the CUDA ops in plain torch (tests: the wrapper's gradient trick and layouts on the CPU)
REFERENCE_OPS = FusedOps("reference", _reference_forward, _reference_backward, 8, "explicit n x n softmax")

_PROBED: Dict[Tuple[str, torch.dtype], Tuple[Optional[FusedOps], Optional[str]]] = {}


def _candidates(device_type: str, dtype: torch.dtype):
    if device_type == "cpu":
        return [CPU_OPS] if dtype in (torch.float32, torch.float64, torch.bfloat16) else []
    if device_type in ("cuda", "meta"):
        if dtype in (torch.bfloat16, torch.float16):
            return [FLASH_OPS, EFFICIENT_OPS]
        if dtype == torch.float32:
            return [EFFICIENT_OPS]
    return []


def fused_ops(device_type: str, dtype: torch.dtype = torch.float32) -> Optional[FusedOps]:
    """The op that serves ``(device_type, dtype)`` tensors, or None (`fused_unavailable` says why): on the CPU
    the flash op (float32, float64, bfloat16); on CUDA the memory-efficient op for float32 and the flash op for
    bfloat16 / float16 (the memory-efficient op where flash is missing, e.g. before sm80); no float64 on CUDA.
    Each op is probed once per process against the explicit form."""
    return _probe_once(device_type, dtype)[0]


def fused_unavailable(device_type: str, dtype: torch.dtype = torch.float32) -> Optional[str]:
    """Why no fused op serves ``(device_type, dtype)`` tensors (worded to follow "the fused kernel ..."), or None."""
    return _probe_once(device_type, dtype)[1]


def constant_for_compile(fn: Callable) -> Callable:
    """``torch.compiler.assume_constant_result(fn)`` without importing ``torch._dynamo`` when this module is
    imported (seconds that a command which never compiles, ``unfold-data inspect``, should not pay).

    The decorator sets one mark on the function and returns it; where ``torch._dynamo`` is not imported yet, the
    same mark is set here (`tests/test_import_time.py` checks that it is the decorator's, on the torch installed).

    Args:
        fn: a function whose result ``torch.compile`` may take as a constant.

    Returns:
        ``fn``, marked.
    """
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    fn._dynamo_marked_constant = True       # what torch._dynamo.assume_constant_result sets
    return fn


@constant_for_compile
def fused_available(device_type: str = "cpu", dtype: torch.dtype = torch.float32) -> bool:
    """Whether a fused op serves ``(device_type, dtype)`` tensors (probed once per process; a constant to
    ``torch.compile``, which does not trace the probe)."""
    return fused_ops(device_type, dtype) is not None


def fused_ops_for_head(ops: FusedOps, head: int, device_type: str, dtype: torch.dtype) -> FusedOps:
    """``ops``, or where its kernels stop below ``head`` columns (FlashAttention-2 above 256, a limit its meta
    kernel does not check) the candidate for ``(device_type, dtype)`` that has no such limit (the memory-efficient
    op), probed once; an [`EnergyError`][energies.EnergyError] where there is none."""
    if ops.max_head is None or head <= ops.max_head:
        return ops
    wide, why = _probe_once(device_type, dtype, wide=True)
    if wide is None:
        raise EnergyError(f"the fused kernel takes at most {ops.max_head} columns per head with {ops.name}, got "
                          f"{head}, and {why}; use kernel 'softmax', 'streamed' or 'triton' there")
    return wide


def _probe_once(device_type: str, dtype: torch.dtype, wide: bool = False):
    key = (device_type, dtype, "any head") if wide else (device_type, dtype)
    if key not in _PROBED:
        why = []
        found = None
        for ops in _candidates(device_type, dtype):
            if wide and ops.max_head is not None:
                continue
            err = _probe(ops, device_type, dtype)
            if err is None:
                found = ops
                break
            why.append(f"{ops.name}: {err}")
        if found is not None:
            _PROBED[key] = (found, None)
        elif not why:
            _PROBED[key] = (None, f"has no fused-attention op for {dtype} tensors on {device_type!r} "
                                  "(CPU: float32/float64/bfloat16; CUDA: float32/bfloat16/float16)")
        else:
            _PROBED[key] = (None, "found no working fused-attention op for " f"{dtype} on {device_type!r} (" +
                            "; ".join(why) + ")")
    return _PROBED[key]


def _probe(ops: FusedOps, device_type: str, dtype: torch.dtype) -> Optional[str]:
    """Run the op forward and backward once on a small case and compare with the explicit form (the shapes only on
    ``meta``). The tensors are made on an explicit device: under a ``torch.device("meta")`` context (the trainer's
    build check) a tensor made without one would be a meta tensor, the probe would fail, and the op would be taken
    as missing for the rest of the process (as it once was, by every training run)."""
    device = "cuda" if device_type == "cuda" else device_type
    try:
        gen = torch.Generator().manual_seed(0)
        base = torch.randn(1, 2, 37, 8, dtype=torch.float64, generator=gen, device="cpu") * 0.5
        q = base.to(device=device, dtype=dtype)
        o, lse, state = ops.forward(q, q, q, 0.7)
        g = torch.ones_like(o)
        dq, dk, dv = ops.backward(g, q, q, q, o, lse, state, 0.7)
        if tuple(o.shape) != tuple(q.shape) or lse.shape[-1] < 37 or tuple(dq.shape) != tuple(q.shape):
            return f"unexpected shapes O {tuple(o.shape)}, LSE {tuple(lse.shape)}, dq {tuple(dq.shape)}"
        if device_type == "meta":
            return None
        ref_o, ref_lse, _ = _reference_forward(base, base, base, 0.7)
        tol = 1e-9 if dtype == torch.float64 else (2e-5 if dtype == torch.float32 else 3e-2)
        o64, lse64 = o.double().cpu(), lse[..., :37].double().cpu()
        if not (torch.allclose(o64, ref_o, atol=tol, rtol=tol) and torch.allclose(lse64, ref_lse[..., :37], atol=tol,
                                                                                   rtol=tol)):
            return "its output or log-sum-exp differs from the explicit form"
        return None
    except (RuntimeError, AttributeError, NotImplementedError, AssertionError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def _pad(t: torch.Tensor, value: float) -> torch.Tensor:
    return torch.cat([t, torch.full_like(t[..., :1], value)], -1)


def _with_column(o: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """``[o, col]`` along the last axis in o's memory order: the CUDA ops' outputs are (B, n, H, c) in memory, and
    the memory-efficient op's half kernels read the ``out`` given to their backward with rows ``H * c`` apart
    whatever its strides (``kernel_backward.h``, ``o_strideM()``); ``torch.cat`` would lay it out (B, H, n, c)."""
    if o.dim() == 4 and not o.is_contiguous() and o.transpose(1, 2).is_contiguous():
        return torch.cat([o.transpose(1, 2), col.transpose(1, 2)], -1).transpose(1, 2)
    return torch.cat([o, col], -1)


class _FusedAttention(torch.autograd.Function):
    """``v=None``: the values are the queries (passed once: dynamo refuses one tensor as two inputs). ``col``: the
    column used for the LSE gradient (None: appended here); ``cut``: the op reads all but the last column (the
    ``spare`` layout)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, col, cut, ops):
        v_is_q = v is None
        v = q if v_is_q else v
        view = (lambda t: t[..., :-1]) if cut else (lambda t: t)
        o, lse_full, state = ops.forward(view(q), view(k), view(v), scale)   # strided views: read in place
        ctx.save_for_backward(q, k, o, lse_full) if v_is_q else ctx.save_for_backward(q, k, o, lse_full, v)
        ctx.scale, ctx.v_is_q, ctx.col, ctx.cut, ctx.ops, ctx.state = scale, v_is_q, col, cut, ops, state
        return o, lse_full[..., :q.shape[-2]]

    @staticmethod
    def backward(ctx, g_o, g_lse):
        q, k, o, lse, *rest = ctx.saved_tensors
        v = q if ctx.v_is_q else rest[0]
        ops, scale, state = ctx.ops, ctx.scale, ctx.state
        g_o = torch.zeros_like(o) if g_o is None else g_o.contiguous()
        if g_lse is None:
            view = (lambda t: t[..., :-1]) if ctx.cut else (lambda t: t)
            dq, dk, dv = ops.backward(g_o, view(q), view(k), view(v), o, lse, state, scale)
            if ctx.cut:
                dq, dk, dv = (torch.nn.functional.pad(g, (0, 1)) for g in (dq, dk, dv))
        elif ctx.col is not None:                      # the layout has a column of zero values: use it in place
            lam = -g_lse.to(o.dtype)
            if ctx.cut:                                # (spare: the op never read the last column; append it)
                out, g_o = _with_column(o, torch.zeros_like(o[..., :1])), _pad(g_o, 0.0)
            else:
                out, g_o = o.clone(), g_o.clone()
            out[..., ctx.col], g_o[..., ctx.col] = lam, 1.0
            dq, dk, dv = ops.backward(g_o, q, k, v, out, lse, state, scale)
            dv[..., ctx.col] = 0.0                     # the values' zero column is a constant: no gradient
        else:
            out = _with_column(o, -g_lse[..., None].to(o.dtype))
            qp, kp = _pad(q, 0.0), _pad(k, 0.0)
            vp = qp if ctx.v_is_q else _pad(v, 0.0)    # values given as the queries: padded once
            dq, dk, dv = ops.backward(_pad(g_o, 1.0), qp, kp, vp, out, lse, state, scale)
            dq, dk, dv = dq[..., :-1], dk[..., :-1], dv[..., :-1]
        if ctx.v_is_q:
            return dq + dv, dk, None, None, None, None, None
        return dq, dk, dv, None, None, None, None


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, spare: bool = False,
                    lse_col: Optional[int] = None, ops: Optional[FusedOps] = None):
    """``(O, LSE)`` of softmax attention, both differentiable (see the module docstring).

    Shapes ``(B, H, n, c)`` for q, k, v (one head size c); returns ``O (B, H, n, c)`` and ``LSE (B, H, n)``
    (float32 from the CUDA ops, the input dtype on the CPU). ``spare=True``: q, k, v come with ``c + 1`` columns
    whose last one is zero (the caller built them so); the op reads the first c in place (``O`` has c columns) and
    the backward uses the zero column for the LSE gradient instead of copying the three inputs once more.
    ``lse_col=j``: the values' column j is zero everywhere (q and k may hold anything there): the op reads all
    columns and the backward uses column j. ``v`` may be ``q`` itself. ``ops``: the op pair (default
    `fused_ops` of the tensors' device and dtype)."""
    if ops is None:
        ops = fused_ops(q.device.type, q.dtype)
        if ops is None:
            raise EnergyError(f"the fused kernel {fused_unavailable(q.device.type, q.dtype)}; use kernel 'softmax', "
                              "'streamed' or 'triton' there")
        ops = fused_ops_for_head(ops, q.shape[-1] + (0 if spare or lse_col is not None else 1), q.device.type,
                                 q.dtype)                      # (the backward reads one column more unless given)
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1]) or (spare and q.shape[-1] < 2):
        raise EnergyError(f"fused attention needs one head size, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                          f"v {tuple(v.shape)}")
    if spare and lse_col is not None:
        raise EnergyError("fused attention takes spare=True or lse_col, not both")
    shared = v is q
    q = q.contiguous()
    col = -1 if spare else (None if lse_col is None else int(lse_col))
    return _FusedAttention.apply(q, k.contiguous(), None if shared else v.contiguous(), float(scale), col,
                                 bool(spare), ops)
