"""Node classification on a stochastic block model with ``UnfoldedAttentionConv`` layers.

``python -m experiments.studies.pyg_sbm [--layers T] [--epochs N] [--json]``

PyG generates the graph offline (``torch_geometric.utils.stochastic_blockmodel_graph``: ``blocks``
communities, edge probability ``p_in`` inside and ``p_out`` across); node features are a noisy
class mean, so that features alone classify poorly and the graph helps. The model is
``Linear -> T x (one shared UnfoldedAttentionConv, anchor x0 = the input) -> Linear``: T steps of
one optimisation, the energy traced at every layer on every forward. The same model with T = 0
(an MLP on the features) is trained beside it as the reference. The last line with ``--json`` is
``{"test_accuracy", "mlp_test_accuracy", "energy_increases", "layer_steps", "energies", ...}``.
"""
from __future__ import annotations

import argparse
import sys

import torch
from torch import nn
from torch_geometric.utils import stochastic_blockmodel_graph

from unfold.cli import positive_int, run_main, seed_int
from unfold.plugins import add_import_arg
from unfold.pyg import UnfoldedAttentionConv
from unfold.trace import report_from_values
from unfold.strict_json import dumps as json_dumps


def sbm_data(blocks: int = 4, size: int = 150, p_in: float = 0.05, p_out: float = 0.005, channels: int = 16,
             sep: float = 0.6, seed: int = 0):
    """``(x, edge_index, y, train, val, test)`` masks 20 / 20 / 60 %."""
    torch.manual_seed(seed)
    probs = torch.full((blocks, blocks), p_out)
    probs.fill_diagonal_(p_in)
    edge_index = stochastic_blockmodel_graph([size] * blocks, probs)
    y = torch.arange(blocks).repeat_interleave(size)
    means = torch.randn(blocks, channels) * sep
    x = means[y] + torch.randn(y.numel(), channels)
    perm = torch.randperm(y.numel())
    split = [int(0.2 * y.numel()), int(0.4 * y.numel())]
    masks = []
    for lo, hi in ((0, split[0]), (split[0], split[1]), (split[1], y.numel())):
        m = torch.zeros(y.numel(), dtype=torch.bool)
        m[perm[lo:hi]] = True
        masks.append(m)
    return (x, edge_index, y, *masks)


class UnfoldedGNN(nn.Module):
    """``Linear -> T shared UnfoldedAttentionConv steps (anchor x0) -> Linear``; ``layers=0`` is an MLP."""

    def __init__(self, in_channels: int, hidden: int, classes: int, layers: int = 4, heads: int = 2):
        super().__init__()
        self.inp = nn.Linear(in_channels, hidden)
        self.conv = UnfoldedAttentionConv(hidden, heads=heads, head_channels=hidden // heads, relu=True)
        self.out = nn.Linear(hidden, classes)
        self.layers = layers

    def forward(self, x, edge_index):
        """``(logits, energies)``: energies ``(T + 1,)`` float64, E at x_0 .. x_T."""
        x0 = self.inp(x)
        h, energies = torch.relu(x0), []
        for _ in range(self.layers):
            h, vals = self.conv(h, edge_index, x0, return_energy=True)
            energies.append(sum(v.detach() for v in vals.values()))
        if self.layers:
            energies.append(self.conv.energy(h, edge_index, x0).detach())
        return self.out(h), torch.stack(energies) if energies else torch.zeros(0, dtype=torch.float64)


def train(layers: int, epochs: int, data, seed: int = 0, hidden: int = 32):
    x, edge_index, y, train_m, val_m, test_m = data
    torch.manual_seed(seed)
    model = UnfoldedGNN(x.shape[1], hidden, int(y.max()) + 1, layers)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    best, increases, steps, last = (-1.0, 0.0), 0, 0, None
    for _ in range(epochs):
        model.train()
        logits, energies = model(x, edge_index)
        if len(energies) >= 2:     # a report needs a step (layers >= 1)
            increases += report_from_values({"E": energies[None]}, torch.float32).num_increases
        steps += max(len(energies) - 1, 0)
        loss = nn.functional.cross_entropy(logits[train_m], y[train_m])
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            logits, last = model(x, edge_index)
            pred = logits.argmax(1)
            val = (pred[val_m] == y[val_m]).float().mean().item()
            test = (pred[test_m] == y[test_m]).float().mean().item()
        if val > best[0]:
            best = (val, test)
    return {"val_accuracy": best[0], "test_accuracy": best[1], "energy_increases": increases,
            "layer_steps": steps, "energies": [] if last is None else last.tolist()}


PROG = "python -m experiments.studies.pyg_sbm"


def main(argv=None) -> int:
    """Command line (module docstring); errors under `unfold.cli.run_main` (one line, exit 2)."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("--layers", type=positive_int, default=4, help="UnfoldedAttentionConv steps, >= 1")
    p.add_argument("--epochs", type=positive_int, default=100)
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--json", action="store_true", help="only the JSON line")
    args = p.parse_args(argv)
    return run_main(PROG, lambda: _run(args), argv)


def _run(args) -> int:
    data = sbm_data(seed=args.seed)
    ours = train(args.layers, args.epochs, data, args.seed)
    mlp = train(0, args.epochs, data, args.seed)
    result = dict(ours, mlp_test_accuracy=mlp["test_accuracy"], mlp_val_accuracy=mlp["val_accuracy"],
                  layers=args.layers, epochs=args.epochs, nodes=int(data[0].shape[0]),
                  edges=int(data[1].shape[1]))
    if not args.json:
        print(f"unfolded ({args.layers} shared UnfoldedAttentionConv steps): test {ours['test_accuracy']:.3f}, "
              f"energy increases {ours['energy_increases']} of {ours['layer_steps']} layer-steps")
        print(f"MLP on the features alone: test {mlp['test_accuracy']:.3f}")
    print(json_dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
