"""Distributed training under ``torchrun``: DistributedDataParallel, gloo on CPU, nccl on CUDA.

``torchrun --standalone --nproc_per_node N -m experiments.app.train --config FILE`` starts N processes;
`setup` sees ``WORLD_SIZE`` and joins the process group. Every rank draws the same shuffled
order (same seed) and takes its contiguous share of each *global* batch of ``train.batch_size``
examples (`shard`); its loss is the sum over its share divided by the global batch size,
times N, so that DDP's gradient average equals the gradient of the single-process mean loss. A
rank whose share is empty (a last batch smaller than N) runs one example with weight 0, so every
rank joins every gradient all-reduce. Metrics, plots and checkpoints are written by rank 0; the
energy statistics of the training trace are summed over ranks (`all_sum`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["Dist", "setup", "shard", "all_sum", "teardown"]


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def rank_from_env() -> int:
    """This process's global rank as torchrun sets it (``RANK``), 0 outside a distributed launch; readable
    before the process group exists."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def setup(device_type: str) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    d = Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if device_type == "cuda":
        torch.cuda.set_device(d.local_rank)
    return d


def shard(batch, d: Dist):
    """``(ids, mask, labels, weight)``: this rank's share of a global batch; weight 0 for a filler row."""
    ids, mask, labels = batch
    if not d.enabled:
        return ids, mask, labels, 1.0
    part = torch.tensor_split(torch.arange(ids.shape[0]), d.world)[d.rank]
    if part.numel() == 0:
        return ids[:1], mask[:1], labels[:1], 0.0
    return ids[part], mask[part], labels[part], 1.0


def all_sum(x: float, d: Dist) -> float:
    if not d.enabled:
        return x
    device = torch.device("cuda", d.local_rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([float(x)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t)


def teardown(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
