"""Attention, MLP-Mixer, FNO and MLP heads as convex programs (Sahiner et al., "Unraveling attention
via convex duality", ICML 2022).

A head maps token features ``X_i`` ``(s, d)`` (zero on padded slots, ``mask_i`` marks the real
ones) to pooled class scores ``yhat_i = pi_i^T f(X_i)`` in R^c, ``pi_i = mask_i / L_i`` (mean over the
L_i real tokens; the paper absorbs global average pooling into the loss, section 2). Trained with
weight decay ``beta/2 sum_j (||W1_j||^2 + ||W2_j||^2)`` the multi-head (multi-neuron) non-convex
head is equivalent to the convex program

    min_{Z_1..Z_G}  l( A(Z) ) + beta sum_g ||Z_g||_*                         (block nuclear norm)

with ``A`` linear. Each head here gives A, its adjoint, the block shapes, the rank-one factor
``(u, v)`` of a non-convex head (``Z_g = sum_j u_j v_j^T``: the lift) and back (the SVD map), and the
non-convex head evaluated directly from its weights (for the lifted identity):

=============  =====  ==================================================  =========================
name           eq.    non-convex head j (pooled)                          block Z_g
=============  =====  ==================================================  =========================
mlp_linear     (6)    pi^T X W1 W2,  W1 d x 1, W2 1 x c                    d x c
mlp_gated      (8)    pi^T D_j X w1 w2^T, D_j = diag(1{X h_j >= 0})        one d x c per gate
sa_linear      (13)   pi^T (X W1 X^T / L) X W2,  W1 d x d, W2 d x c        d^2 x dc
sa_block       (14)   sa_linear with W1, W2 supported on feature group b   d_b d x d_b c per group
sa_gated       (123)  pi^T ((1{X H_j X^T >= 0} o X W1 X^T) / L) X W2       d^2 x dc per gate
mixer_linear   (19)   pi^T W1 X W2,  W1 s x s (token mixing), W2 d x c     s^2 x dc
mixer_gated    (133)  pi^T (1{H_j X >= 0} o W1 X) W2                       s^2 x dc per gate
fno_linear     (25)   pi^T circ(X) w1 w2^T,  w1 in R^{sd} a global conv    sd x c
bfno           (30)   FNO per feature group b onto class group b          (s d/B) x (c/B) per block
=============  =====  ==================================================  =========================

(The 1/L of the attention scores makes the score scale independent of the length; it is a
per-example constant, so the equivalence is unchanged.) Gates are fixed Gaussian draws (seeded):
the gated heads are the paper's gated-ReLU relaxations, exact for fixed gates.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from energies.errors import ConfigError, TokenError
from energies.checks import check_int, check_seed
from energies.memory import check_memory
from energies.registry import Registry
from unfold.inputs import bool_mask

__all__ = ["Head", "HEADS", "register_head", "make_head", "pooling", "circ_features"]

HEADS: Registry = Registry("convex head", ConfigError, "name", "convex.heads.HEADS")
register_head = HEADS.register
Weights = List[Tuple[int, torch.Tensor, torch.Tensor]]     # (block g, W1_j, W2_j) per non-convex head


def pooling(mask: torch.Tensor, dtype) -> torch.Tensor:
    """``pi = mask / L`` ``(N, s)``: the mean over real tokens."""
    m = mask.to(dtype)
    return m / m.sum(-1, keepdim=True).clamp_min(1.0)


def circ_features(X: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """``phi[u, a] = sum_o pi_o X[(o - u) mod s, a]``: ``pi^T circ(X)`` of eq. (23), ``(N, s * d)``
    (circular cross-correlation of the pooling weights with X, by FFT)."""
    s = X.shape[1]
    fx = torch.fft.rfft(X, dim=1)
    fp = torch.fft.rfft(pi, dim=1)
    phi = torch.fft.irfft(torch.conj(fx) * fp[..., None], n=s, dim=1)     # phi[u, a] = sum_t pi[t + u] X[t, a]
    return phi.reshape(X.shape[0], -1)


class Head:
    """A convex head (module docstring): the linear map A of the convex program
    ``min_Z l(A(Z)) + beta sum_g ||Z_g||_*`` equivalent to a non-convex head trained with weight decay (eq. 32,
    Lemma A.1's general form; eq. 12 for self-attention). Each subclass's ``equation`` names its program (e.g.
    ``"13"`` for ``sa_linear``). ``prepare(X, mask)`` turns data into what ``forward`` and ``adjoint`` read;
    everything is linear in the blocks ``Z = [Z_1, ..., Z_G]``.

    Subclasses are registered with [`register_head`][convex.register_head] and built by [`make_head`][convex.make_head];
    their own options (``gates``, ``groups``) are keyword arguments of their constructors.

    Args:
        d: the feature dimension, an int >= 1.
        s: the token slots per example (the padded length), an int >= 1.
        c: the number of classes (the pooled outputs), an int >= 1.
        seed: the seed of the gated heads' fixed Gaussian gates, an int in [0, 2**63 - 1].
        **options: a subclass's own options; the base class takes none.

    Raises:
        ConfigError: d, s, c or seed out of range, or an option the head does not take (named).
    """

    name = "head"
    equation = ""

    def __init__(self, d: int, s: int, c: int, seed: int = 0, **options):
        if options:
            raise ConfigError(f"head {self.name} takes no option(s) {sorted(options)}")
        self.d, self.s, self.c = (check_int(v, f"head {self.name}: {k}", 1, error=ConfigError)
                                  for k, v in (("d", d), ("s", s), ("c", c)))
        self.seed = check_seed(seed, f"head {self.name}: seed", ConfigError)

    # ---------------------------------------------------------------- structure
    def blocks(self) -> List[Tuple[int, int]]:
        raise NotImplementedError

    def prepare(self, X: torch.Tensor, mask: Optional[torch.Tensor] = None) -> dict:
        """The data the operators read (with ``prepared_by``, the head's [`signature`][convex.Head.signature]). Refuses
        ([`TokenError`][energies.TokenError]) no examples, features that are not float32 or float64 (the solver's SVDs
        take no other), non-finite features, and features whose products overflow (every prepared tensor must be
        finite). ``mask``: ``(N, s)``, a padding mask as the encoders take it (`unfold.inputs.bool_mask`: bool, 0/1
        integers, None for all real; a float mask or another shape refused, [`InputError`][energies.InputError])."""
        if not isinstance(X, torch.Tensor) or X.ndim != 3 or X.shape[1:] != (self.s, self.d):
            raise TokenError(f"head {self.name} needs features (N, s={self.s}, d={self.d}), "
                             f"got {tuple(getattr(X, 'shape', ()))}")
        if X.shape[0] < 1:
            raise TokenError(f"head {self.name} needs at least one example, got N=0")
        if X.dtype not in (torch.float32, torch.float64):    # the solver's SVDs and norms take no other dtype
            raise TokenError(f"head {self.name}: features must be float32 or float64, got {X.dtype}")
        if X.device.type == "meta":
            raise TokenError(f"head {self.name}: features on the meta device hold no values to solve with")
        if not bool(torch.isfinite(X).all()):
            raise TokenError(f"head {self.name}: features hold NaN or Inf")
        if isinstance(mask, torch.Tensor):
            mask = mask.to(X.device)
        mask = bool_mask(mask, X.shape[:2], X.device, f"head {self.name}: features", validate=True)
        X = X * mask[..., None].to(X.dtype)
        pi = pooling(mask, X.dtype)
        data = {"X": X, "mask": mask, "pi": pi, **self._prepare(X, mask, pi), "prepared_by": self.signature()}
        for key, value in data.items():
            parts = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, torch.Tensor) and v.dtype.is_floating_point and not bool(torch.isfinite(v).all())
                   for v in parts):
                raise TokenError(f"head {self.name}: the features' products overflow {X.dtype} (prepared {key!r} "
                                 f"is not finite; largest |feature| {float(X.abs().max()):.3g}): rescale the features")
        return data

    def _prepare(self, X, mask, pi) -> dict:
        return {}

    def signature(self) -> tuple:
        """What the prepared data depend on: the class, its name and every int/str attribute (d, s, c, seed, gates,
        groups); [`prepare`][convex.Head.prepare] records it and the solver refuses data prepared by a head of another
        signature."""
        return (type(self).__qualname__, self.name,
                *sorted((k, v) for k, v in vars(self).items() if isinstance(v, (int, str)) and not isinstance(v, bool)))

    def forward(self, Z: Sequence[torch.Tensor], data: dict) -> torch.Tensor:
        raise NotImplementedError

    def adjoint(self, R: torch.Tensor, data: dict) -> List[torch.Tensor]:
        raise NotImplementedError

    # ---------------------------------------------------------------- non-convex form
    def factor(self, g: int, W1: torch.Tensor, W2: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Non-convex head weights -> ``(u, v)`` with ``Z_g += u v^T`` (the lift)."""
        return W1.reshape(-1), W2.reshape(-1)

    def unfactor(self, g: int, u: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(u, v)`` -> non-convex head weights (inverse of [`factor`][convex.Head.factor])."""
        raise NotImplementedError

    def nonconvex(self, heads: Weights, data: dict) -> torch.Tensor:
        """The non-convex multi-head output evaluated from the weights (not through Z)."""
        raise NotImplementedError

    def lift(self, heads: Weights) -> List[torch.Tensor]:
        """The blocks ``Z_g = sum_j u_j v_j^T`` of non-convex heads ``[(g, W1_j, W2_j), ...]``
        ([`factor`][convex.Head.factor]); each head is checked first: g a block index, W1 and W2 floating tensors of the
        shapes [`unfactor`][convex.Head.unfactor] gives (a [`ConfigError`][energies.ConfigError] names the head and what
        is
        wrong)."""
        blocks = self.blocks()
        if not isinstance(heads, (list, tuple)):
            raise ConfigError(f"head {self.name}: lift needs a list of (g, W1, W2), got {type(heads).__name__}")
        for j, item in enumerate(heads):
            if not isinstance(item, (list, tuple)) or len(item) != 3:
                raise ConfigError(f"head {self.name}: lift's head {j} must be (g, W1, W2), got {type(item).__name__}")
            g = check_int(item[0], f"head {self.name}: lift's head {j} block g", 0, len(blocks) - 1, ConfigError)
            want = [tuple(w.shape) for w in self.unfactor(g, torch.zeros(blocks[g][0]), torch.zeros(blocks[g][1]))]
            for name, w, shape in zip(("W1", "W2"), item[1:], want):
                if not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point or tuple(w.shape) != shape:
                    raise ConfigError(f"head {self.name}: lift's head {j} {name} must be a floating {shape} tensor, "
                                      f"got {tuple(getattr(w, 'shape', ()))} {getattr(w, 'dtype', type(w).__name__)}")
        Z = [torch.zeros(r, q, dtype=torch.float64) for r, q in blocks]
        for g, W1, W2 in heads:
            g = int(g)
            u, v = self.factor(g, W1, W2)
            Z[g] = Z[g].to(u) + torch.outer(u, v)
        return Z

    def describe(self) -> str:
        return f"{self.name} (eq. {self.equation}): blocks {self.blocks()}"


# ====================================================================== explicit features
class _FeatureHead(Head):
    """Heads with ``yhat[:, cols_g] = F_g Z_g.reshape(F_g.shape[1], len(cols_g))`` (features precomputed)."""

    def _features(self, X, mask, pi) -> List[torch.Tensor]:
        raise NotImplementedError

    def _cols(self, g: int) -> slice:
        return slice(0, self.c)

    def _prepare(self, X, mask, pi):
        blocks = self.blocks()     # F_g is (N, rows of Z_g x its columns / the classes it feeds): checked first
        entries = X.shape[0] * sum(r * q // len(range(self.c)[self._cols(g)]) for g, (r, q) in enumerate(blocks))
        check_memory(2 * entries * X.element_size(), f"head {self.name}: features of N={X.shape[0]} examples for "
                     f"blocks {blocks} ({entries:,} entries of {X.dtype})", TokenError,
                     "use fewer examples or a smaller d, s or gates", device=X.device)
        return {"F": self._features(X, mask, pi)}

    def forward(self, Z, data):
        F = data["F"]
        out = torch.zeros(F[0].shape[0], self.c, dtype=F[0].dtype, device=F[0].device)
        for g, (Fg, Zg) in enumerate(zip(F, Z)):
            cols = self._cols(g)
            out[:, cols] += Fg @ Zg.reshape(Fg.shape[1], -1)
        return out

    def adjoint(self, R, data):
        return [(Fg.T @ R[:, self._cols(g)]).reshape(shape) for g, (Fg, shape) in enumerate(zip(data["F"], self.blocks()))]


def _attention_heads(heads: Weights, data: dict, M: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Pooled multi-head linear (or, with gate masks M ``(N, m, s, s)``, gated) self-attention computed
    from the weights: ``sum_j pi^T ((M_j o X W1_j X^T) / L) X W2_j`` (eq. 11, 123)."""
    X, pi, mask = data["X"], data["pi"], data["mask"]
    L = mask.sum(-1).to(X.dtype).clamp_min(1.0)
    out = 0
    for g, W1, W2 in heads:
        scores = X @ W1 @ X.transpose(1, 2) / L[:, None, None]
        if M is not None:
            scores = M[:, g] * scores
        out = out + torch.einsum("no,nop->np", pi, scores @ X @ W2)
    return out


def _gates(shape, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64)


@register_head("mlp_linear")
class MLPLinear(_FeatureHead):
    equation = "6"

    def blocks(self):
        return [(self.d, self.c)]

    def _features(self, X, mask, pi):
        return [torch.einsum("ns,nsd->nd", pi, X)]

    def unfactor(self, g, u, v):
        return u[:, None], v[None, :]

    def nonconvex(self, heads, data):
        return sum(data["pi"][:, None, :].matmul(data["X"] @ W1 @ W2)[:, 0] for _, W1, W2 in heads)


@register_head("mlp_gated")
class MLPGated(_FeatureHead):
    equation = "8"

    def __init__(self, d, s, c, gates: int = 4, seed: int = 0, **kw):
        super().__init__(d, s, c, seed, **kw)
        self.m = check_int(gates, f"head {self.name}: gates", 1, error=ConfigError)
        self.H = _gates((self.m, self.d), self.seed)

    def blocks(self):
        return [(self.d, self.c)] * self.m

    def _masks(self, X):
        return (X @ self.H.to(X).T >= 0).to(X.dtype)                   # (N, s, m): 1{X h_j >= 0}

    def _features(self, X, mask, pi):
        D = self._masks(X)
        return list(torch.einsum("ns,nsj,nsd->jnd", pi, D, X).unbind(0))

    def unfactor(self, g, u, v):
        return u, v

    def nonconvex(self, heads, data):
        X, pi = data["X"], data["pi"]
        D = self._masks(X)
        return sum(torch.einsum("ns,ns,nsd,d,p->np", pi, D[..., g], X, w1, w2) for g, w1, w2 in heads)


@register_head("fno_linear")
class FNOLinear(_FeatureHead):
    equation = "25"

    def blocks(self):
        return [(self.s * self.d, self.c)]

    def _features(self, X, mask, pi):
        return [circ_features(X, pi)]

    def unfactor(self, g, u, v):
        return u.reshape(self.s, self.d), v

    @staticmethod
    def _conv(X, K):
        """Global circular convolution over tokens, ``out[o] = sum_{u, a} X[(o - u) mod s, a] K[u, a]``
        (the FNO's Fourier-domain product, eq. 22), by FFT."""
        s = X.shape[1]
        return torch.fft.irfft(torch.fft.rfft(X, dim=1) * torch.fft.rfft(K, dim=0)[None], n=s, dim=1).sum(-1)

    def nonconvex(self, heads, data):
        X, pi = data["X"], data["pi"]
        return sum((pi * self._conv(X, K)).sum(1)[:, None] * w2[None] for _, K, w2 in heads)


@register_head("bfno")
class BFNO(FNOLinear):
    equation = "30"

    def __init__(self, d, s, c, groups: int = 2, seed: int = 0, **kw):
        super().__init__(d, s, c, seed, **kw)
        self.B = check_int(groups, f"head {self.name}: groups", 1, error=ConfigError)
        if self.d % self.B or self.c % self.B:
            raise ConfigError(f"bfno needs groups dividing d={self.d} and c={self.c}, got groups={groups}")
        self.db, self.cb = self.d // self.B, self.c // self.B

    def blocks(self):
        return [(self.s * self.db, self.cb)] * self.B

    def _cols(self, g):
        return slice(g * self.cb, (g + 1) * self.cb)

    def _features(self, X, mask, pi):
        return [circ_features(X[..., b * self.db:(b + 1) * self.db], pi) for b in range(self.B)]

    def unfactor(self, g, u, v):
        return u.reshape(self.s, self.db), v

    def nonconvex(self, heads, data):
        X, pi = data["X"], data["pi"]
        out = torch.zeros(X.shape[0], self.c, dtype=X.dtype, device=X.device)
        for b, K, w2 in heads:
            Xb = X[..., b * self.db:(b + 1) * self.db]
            out[:, self._cols(b)] += (pi * self._conv(Xb, K)).sum(1)[:, None] * w2[None]
        return out


@register_head("sa_gated")
class SAGated(_FeatureHead):
    """Z_j rows (k, a), columns (l, p): ``Z_j[(k, a), (l, p)] = sum W1[a, k] W2[l, p]``; features
    ``C_j[k, a, l] = sum_{o, t} pi_o 1{(X H_j X^T)[o, t] >= 0} X[o, a] X[t, k] X[t, l] / L``."""

    equation = "123"

    def __init__(self, d, s, c, gates: int = 2, seed: int = 0, **kw):
        super().__init__(d, s, c, seed, **kw)
        self.m = check_int(gates, f"head {self.name}: gates", 1, error=ConfigError)
        self.H = _gates((self.m, self.d, self.d), self.seed)

    def blocks(self):
        return [(self.d * self.d, self.d * self.c)] * self.m

    def _masks(self, X, mask):
        S = torch.einsum("noa,jak,ntk->njot", X, self.H.to(X), X)
        return ((S >= 0) & mask[:, None, None, :]).to(X.dtype)       # keys: real tokens only

    def _features(self, X, mask, pi):
        M = self._masks(X, mask)
        L = mask.sum(-1).to(X.dtype).clamp_min(1.0)
        B = torch.einsum("no,njot,noa->njat", pi, M, X) / L[:, None, None, None]   # (N, m, d, s)
        C = torch.einsum("njat,ntk,ntl->njkal", B, X, X)
        return list(C.reshape(X.shape[0], self.m, -1).unbind(1))

    def factor(self, g, W1, W2):
        return W1.T.reshape(-1), W2.reshape(-1)

    def unfactor(self, g, u, v):
        return u.reshape(self.d, self.d).T, v.reshape(self.d, self.c)

    def nonconvex(self, heads, data):
        return _attention_heads(heads, data, self._masks(data["X"], data["mask"]))


# ====================================================================== implicit operators
@register_head("sa_linear")
class SALinear(Head):
    """``yhat[p] = sum_{k,a,l} G[k, l] xbar[a] Z4[k, a, l, p]``, G = X^T X / L, Z4 = Z.view(d, d, d, c)."""

    equation = "13"

    def _groups(self) -> List[slice]:
        return [slice(0, self.d)]

    def blocks(self):
        return [((r.stop - r.start) * self.d, (r.stop - r.start) * self.c) for r in self._groups()]

    def _prepare(self, X, mask, pi):
        L = mask.sum(-1).to(X.dtype).clamp_min(1.0)
        G = X.transpose(1, 2) @ X / L[:, None, None]
        return {"G": G, "xbar": torch.einsum("ns,nsd->nd", pi, X)}

    def forward(self, Z, data):
        G, xbar = data["G"], data["xbar"]
        out = 0
        for r, Zg in zip(self._groups(), Z):
            db = r.stop - r.start
            Z4 = Zg.reshape(db, self.d, db, self.c)                                   # [k, a, l, p]
            T = (xbar @ Z4.permute(1, 0, 2, 3).reshape(self.d, -1)).reshape(-1, db, db, self.c)
            out = out + torch.einsum("nkl,nklp->np", G[:, r, r], T)
        return out

    def adjoint(self, R, data):
        G, xbar = data["G"], data["xbar"]
        out = []
        for r in self._groups():
            db = r.stop - r.start
            GR = torch.einsum("nkl,np->nklp", G[:, r, r], R).reshape(R.shape[0], -1)
            Z4 = (xbar.T @ GR).reshape(self.d, db, db, self.c).permute(1, 0, 2, 3)     # [k, a, l, p]
            out.append(Z4.reshape(db * self.d, db * self.c))
        return out

    def factor(self, g, W1, W2):
        r = self._groups()[g]
        return W1[:, r].T.reshape(-1), W2[r, :].reshape(-1)

    def unfactor(self, g, u, v):
        r = self._groups()[g]
        db = r.stop - r.start
        W1 = torch.zeros(self.d, self.d, dtype=u.dtype, device=u.device)
        W2 = torch.zeros(self.d, self.c, dtype=v.dtype, device=v.device)
        W1[:, r] = u.reshape(db, self.d).T
        W2[r, :] = v.reshape(db, self.c)
        return W1, W2

    def nonconvex(self, heads, data):
        return _attention_heads(heads, data)


@register_head("sa_block")
class SABlock(SALinear):
    """eq. (14): one block per feature group I_b (contiguous, ``groups`` of them)."""

    equation = "14"

    def __init__(self, d, s, c, groups: int = 2, seed: int = 0, **kw):
        super().__init__(d, s, c, seed, **kw)
        self.B = check_int(groups, f"head {self.name}: groups", 1, error=ConfigError)
        if self.d % self.B:
            raise ConfigError(f"sa_block needs groups dividing d={self.d}, got groups={groups}")

    def _groups(self):
        db = self.d // self.B
        return [slice(b * db, (b + 1) * db) for b in range(self.B)]


@register_head("mixer_linear")
class MixerLinear(Head):
    """``yhat[p] = sum_{t,o,k} pi_o X[t, k] Z4[t, o, k, p]``, Z4 = Z.view(s, s, d, c); rows (t, o), columns (k, p).

    Computed as one matrix product: ``yhat = sum_o pi_o (Xf Zr)[(o, p)]`` with ``Xf`` the flattened
    tokens ``(N, (t, k))`` and ``Zr`` = Z4 rearranged ``((t, k), (o, p))``; the adjoint is
    ``Zr = Xf^T (pi (x) R)``, ``(pi (x) R)[i, (o, p)] = pi_io R_ip``."""

    equation = "19"

    def blocks(self):
        return [(self.s * self.s, self.d * self.c)]

    def _gate_masks(self, X) -> Optional[torch.Tensor]:
        return None                                                     # (N, m, s, d) for the gated mixer

    def _prepare(self, X, mask, pi):
        return {"M": self._gate_masks(X), "Xf": X.reshape(X.shape[0], -1)}

    def forward(self, Z, data):
        (Zg,) = Z
        Zr = Zg.reshape(self.s, self.s, self.d, self.c).permute(0, 2, 1, 3).reshape(self.s * self.d, -1)
        T = (data["Xf"] @ Zr).reshape(-1, self.s, self.c)                         # (N, o, p)
        return torch.einsum("no,nop->np", data["pi"], T)

    def adjoint(self, R, data):
        PR = (data["pi"][:, :, None] * R[:, None, :]).reshape(R.shape[0], -1)     # (N, (o, p))
        Zr = data["Xf"].T @ PR                                                    # ((t, k), (o, p))
        return [Zr.reshape(self.s, self.d, self.s, self.c).permute(0, 2, 1, 3).reshape(self.s * self.s, -1)]

    def factor(self, g, W1, W2):
        return W1.T.reshape(-1), W2.reshape(-1)

    def unfactor(self, g, u, v):
        return u.reshape(self.s, self.s).T, v.reshape(self.d, self.c)

    def nonconvex(self, heads, data):
        X, pi, M = data["X"], data["pi"], data["M"]
        out = 0
        for g, W1, W2 in heads:
            H = W1 @ X                                                   # token mixing (N, s, d)
            if M is not None:
                H = M[:, g] * H
            out = out + torch.einsum("no,nop->np", pi, H @ W2)
        return out


@register_head("mixer_gated")
class MixerGated(MixerLinear):
    """eq. (133): mask ``1{H_j X >= 0}`` (s x d) on the token-mixed features,
    ``yhat[p] = sum_j sum_{t,o,k} pi_o M_j[o, k] X[t, k] Z4_j[t, o, k, p]``.

    Batched over the feature k and all gates at once: ``B_k = X[:, :, k] [Z4_1[:, :, k, :] .. Z4_m[:, :, k, :]]``
    ``(N, (j, o, p))``, then ``yhat[p] = sum_{k, j, o} W[k, i, (j, o)] B_k[i, (j, o, p)]`` with the pooled
    gate weights ``W[k, i, (j, o)] = pi_io M_j[i, o, k]`` (laid out once by [`prepare`][convex.Head.prepare]); the
    adjoint is ``Z4_j[:, :, k, :] = X[:, :, k]^T (W[k] (x) R)``."""

    equation = "133"

    def __init__(self, d, s, c, gates: int = 2, seed: int = 0, **kw):
        super().__init__(d, s, c, seed, **kw)
        self.m = check_int(gates, f"head {self.name}: gates", 1, error=ConfigError)
        self.H = _gates((self.m, self.s, self.s), self.seed)

    def blocks(self):
        return [(self.s * self.s, self.d * self.c)] * self.m

    def _gate_masks(self, X):
        return (torch.einsum("jot,ntk->njok", self.H.to(X), X) >= 0).to(X.dtype)

    def _prepare(self, X, mask, pi):
        M = self._gate_masks(X)                                                   # (N, j, o, k)
        W = (pi[:, None, :, None] * M).permute(3, 0, 1, 2).reshape(self.d, X.shape[0], -1).contiguous()
        return {"M": M, "Xk": X.permute(2, 0, 1).contiguous(), "XkT": X.permute(2, 1, 0).contiguous(),
                "Wk": W}                                                          # (k, N, t), (k, t, N), (k, N, (j, o))

    def forward(self, Z, data):
        m, s, d, c = self.m, self.s, self.d, self.c
        Zk = torch.stack([z.reshape(s, s, d, c) for z in Z], 2).permute(3, 0, 2, 1, 4).reshape(d, s, -1)  # (k, t, (j, o, p))
        B = torch.bmm(data["Xk"], Zk).reshape(d, -1, m * s, c)                   # (k, N, (j, o), p)
        W = data["Wk"]
        return torch.matmul(W[:, :, None, :], B)[:, :, 0].sum(0)

    def adjoint(self, R, data):
        m, s, d, c = self.m, self.s, self.d, self.c
        WR = (data["Wk"][..., None] * R[None, :, None, :]).reshape(d, R.shape[0], -1)   # (k, N, (j, o, p))
        G = torch.bmm(data["XkT"], WR).reshape(d, s, m, s, c)                          # (k, t, j, o, p)
        return [G[:, :, j].permute(1, 2, 0, 3).reshape(s * s, d * c) for j in range(m)]


def make_head(name: str, d: int, s: int, c: int, **options) -> Head:
    """A head by name (``HEADS``); options: ``gates`` (gated heads), ``groups`` (sa_block, bfno), ``seed``.

    Each head is the linear map A of one convex program of the paper, named by its ``equation`` (the module
    docstring's table): mlp_linear eq. 6, mlp_gated 8, sa_linear 13, sa_block 14, sa_gated 123, mixer_linear 19,
    mixer_gated 133, fno_linear 25, bfno 30.

    Args:
        name: a registered head's name (``sorted(HEADS)``).
        d: the feature dimension, an int >= 1.
        s: the token slots per example (the padded length), an int >= 1.
        c: the number of classes, an int >= 1.
        **options: ``gates``, the number of fixed gates (mlp_gated: default 4; sa_gated, mixer_gated: default
            2); ``groups``, the feature groups (sa_block: dividing d; bfno: dividing d and c; default 2);
            ``seed``, the gates' seed (default 0). A head refuses an option it does not take.

    Returns:
        The [`Head`][convex.Head], ready for ``prepare(X, mask)``.

    Raises:
        ConfigError: an unknown name (the valid ones listed), an option the head does not take, or a value out
            of range.
    """
    return HEADS.lookup(name)(d, s, c, **options)
