"""``task: masked_tokens``: masked-token denoising (BERT's pretraining objective) on the training split's texts.

Of the real tokens of each text that are not special (never padding, ``<unk>``/``[UNK]`` or the mask token),
``pretrain.mask_rate`` (15 %) are chosen; of those 80 % are replaced by the mask id, 10 % by a random non-special
id and 10 % kept (Devlin et al., 2019). With ``pretrain.span_mean`` set, whole spans are chosen instead, of
geometric length with that mean (clipped at `MAX_SPAN`), until the rate is reached (SpanBERT, Joshi et al., 2020).
The model predicts the original token at every chosen position (`unfold.MaskedTokenModel`); the loss is the
cross-entropy there.

The masking is drawn by a generator seeded from ``train.seed``, the epoch and the batch's number
(`batch_generator`): the same run masks the same tokens, and a resumed run continues bit for bit. Evaluation
masks with epoch 0's seeds, the same positions at every epoch.

The texts: the training split's (its first ``train.max_train_examples`` when set), labels ignored; a fraction
``pretrain.heldout`` of them (5 %, at least one), drawn with ``data.seed``, is held out: the run validates, tests
and checks its descent there, never on the dataset's validation or test texts (which stay unseen for a model
fine-tuned later).

With ``data.texts`` set, the texts are that file's or folder's lines instead, read as a stream
(`experiments.data.stream.TextStream`): text ``i`` is held out by a hash rule on ``(data.seed, i)`` (at most
``pretrain.heldout_max`` of them, kept in memory), and every epoch reads the training texts again through a shuffle
buffer of ``pretrain.shuffle_buffer`` texts drawn with the run's data generator. Memory stays bounded whatever the
file's size; a resumed run reads the same batches, since the generator's state is in the checkpoint.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch

from unfold.masked_lm import MaskedTokenModel, tied_head

from ...data.stream import TextStream
from ...runfolder.fingerprint import data_fingerprint
from .registry import Task, register_task

#: the target of a position that is not scored
IGNORE = -100
#: the longest span of span masking (SpanBERT's clip)
MAX_SPAN = 10
#: of the chosen positions: the share replaced by the mask id, then by a random id (the rest kept)
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1


def batch_generator(seed: int, epoch: int, batch: int) -> torch.Generator:
    """The generator that masks batch ``batch`` (from 1) of epoch ``epoch`` (0: evaluation) of a run seeded
    ``seed``."""
    return torch.Generator().manual_seed((((seed % 2 ** 40) * 1_000_003 + epoch) * 1_000_003 + batch) % 2 ** 63)


def maskable(ids: torch.Tensor, mask: torch.Tensor, special_ids) -> torch.Tensor:
    """``(B, n)`` bool: the real tokens that are not special, the only ones masking may choose."""
    return mask & ~torch.isin(ids, torch.tensor(sorted(special_ids), dtype=ids.dtype))


def choose_tokens(candidates: torch.Tensor, rate: float, g: torch.Generator) -> torch.Tensor:
    """Each candidate chosen with probability ``rate``."""
    return (torch.rand(candidates.shape, generator=g) < rate) & candidates


def choose_spans(candidates: torch.Tensor, rate: float, span_mean: float, g: torch.Generator) -> torch.Tensor:
    """Spans of geometric length (mean ``span_mean``, at most `MAX_SPAN`) over each row's candidates, started at
    uniform candidates, until ``round(rate * candidates)`` (at least one) are chosen."""
    chosen = torch.zeros_like(candidates)
    p = 1.0 / span_mean
    for row in range(candidates.shape[0]):
        where = candidates[row].nonzero().squeeze(1)
        m = where.numel()
        if m == 0:
            continue
        budget, count = max(1, round(rate * m)), 0
        for _ in range(4 * budget + 8):
            u_len, u_start = torch.rand(2, generator=g, dtype=torch.float64).tolist()
            length = 1 if p >= 1 else min(MAX_SPAN, 1 + int(math.log(max(u_len, 1e-300)) / math.log(1 - p)))
            start = min(int(u_start * m), m - 1)
            span = where[start:start + min(length, budget - count)]
            fresh = ~chosen[row, span]
            chosen[row, span] = True
            count += int(fresh.sum())
            if count >= budget:
                break
    return chosen


def mask_batch(ids: torch.Tensor, mask: torch.Tensor, vocab, rate: float, span_mean: Optional[float],
               g: torch.Generator):
    """``(inputs, targets)`` of a host batch: the chosen positions' ids replaced (80/10/10), and the original
    ids there (`IGNORE` elsewhere). A batch with candidates has at least one chosen position."""
    candidates = maskable(ids, mask, vocab.special_ids)
    chosen = choose_tokens(candidates, rate, g) if span_mean is None else \
        choose_spans(candidates, rate, span_mean, g)
    if not chosen.any() and candidates.any():
        flat = candidates.reshape(-1).nonzero().squeeze(1)
        chosen.view(-1)[flat[torch.randint(flat.numel(), (1,), generator=g)]] = True
    r = torch.rand(ids.shape, generator=g)
    ordinary = torch.tensor([i for i in range(len(vocab)) if i not in set(vocab.special_ids)], dtype=ids.dtype)
    random_ids = ordinary[torch.randint(max(ordinary.numel(), 1), ids.shape, generator=g)] if ordinary.numel() \
        else ids
    inputs = torch.where(chosen & (r < MASK_SHARE), torch.full_like(ids, vocab.mask_id), ids)
    inputs = torch.where(chosen & (r >= MASK_SHARE) & (r < MASK_SHARE + RANDOM_SHARE), random_ids, inputs)
    return inputs, torch.where(chosen, ids, torch.full_like(ids, IGNORE))


def heldout_split(n: int, fraction: float, seed: int):
    """``(train rows, held-out rows)`` of ``n`` texts, each sorted: ``round(fraction * n)`` (at least one, at most
    ``n - 1``) drawn with ``seed``."""
    k = min(max(1, round(fraction * n)), n - 1)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[k:].sort().values, perm[:k].sort().values


@register_task("masked_tokens")
class MaskedTokens(Task):
    """Masked-token denoising (module docstring)."""

    mask_token = True
    labelled = False
    pipeline = "fill-mask"

    def __init__(self, cfg: Dict[str, Any]):
        super().__init__(cfg)
        pc = cfg["pretrain"]
        self.rate, self.span_mean, self.vocab = pc["mask_rate"], pc["span_mean"], None
        self.texts: Dict[str, list] = {}
        self.head_kind = None

    def data(self, splits, vocab, tensors):
        self.vocab = vocab
        if self.cfg["data"]["texts"] is not None:
            return self._stream_data(vocab)
        limit = self.cfg["train"]["max_train_examples"]
        texts = [t for t, _ in (splits.train if limit is None else splits.train[:limit])]
        ids, mask, labels = tensors["train"]
        if len(texts) < 2:
            from ...data import DataError

            raise DataError(f"task=masked_tokens needs at least 2 training texts (one held out), got {len(texts)}")
        keep, held = heldout_split(len(texts), self.cfg["pretrain"]["heldout"], self.cfg["data"]["seed"])
        self.texts = {"train": [texts[i] for i in keep.tolist()], "heldout": [texts[i] for i in held.tolist()]}
        part = {name: (ids[rows], mask[rows], torch.zeros(len(rows), dtype=labels.dtype))
                for name, rows in (("train", keep), ("heldout", held))}
        return {"train": part["train"], "val": part["heldout"], "test": part["heldout"]}, \
            {"pretrain_texts": len(keep), "heldout_texts": len(held)}

    def _stream_data(self, vocab):
        """The training texts of ``data.texts`` as a `TextStream`; its held-out texts encoded (module docstring)."""
        from ...data import encode
        from ...data.stream import TextStream

        dc, pc = self.cfg["data"], self.cfg["pretrain"]
        stream = TextStream(dc["texts"], pc["heldout"], dc["seed"], pc["heldout_max"],
                            self.cfg["train"]["max_train_examples"])
        self.texts = {"train": stream, "heldout": stream.heldout_texts}
        held = encode([(t, 0) for t in stream.heldout_texts], vocab, dc["max_len"])
        return {"train": stream, "val": held, "test": held}, \
            {"pretrain_texts": len(stream), "heldout_texts": len(stream.heldout_texts), "texts": str(dc["texts"])}

    def fingerprint(self, vocab) -> Dict[str, Any]:
        """The data fingerprint of the texts pretrained on (``train``) and held out (``val``), labels ignored."""
        train = self.texts["train"]
        return data_fingerprint(vocab.itos, train if isinstance(train, TextStream) else [(t, 0) for t in train],
                                [(t, 0) for t in self.texts["heldout"]], [], [], tokenizer=vocab.tokenizer_digest)

    def size(self, part) -> int:
        return len(part) if isinstance(part, TextStream) else super().size(part)

    def head(self, embedding, vocab_size: int, num_classes: int):
        head = tied_head(embedding, self.cfg["model"]["d"], vocab_size)
        self.head_kind = "tied" if head.tied else "linear"
        return head

    def model(self, embedding, encoder, head) -> MaskedTokenModel:
        return MaskedTokenModel(embedding, encoder, head, dropout=self.cfg["model"]["dropout"])

    def batches(self, tensors, batch_size: int, generator: Optional[torch.Generator] = None,
                epoch: Optional[int] = None):
        from ...data import batches

        seed = self.cfg["train"]["seed"]
        if isinstance(tensors, TextStream):
            from ...data import encode

            max_len = self.cfg["data"]["max_len"]
            source = tensors.batches(lambda texts: encode([(t, 0) for t in texts], self.vocab, max_len), batch_size,
                                     self.cfg["pretrain"]["shuffle_buffer"], generator)
        else:
            source = batches(*tensors, batch_size, shuffle=generator is not None, generator=generator)
        for i, (b_ids, b_mask, _) in enumerate(source, start=1):
            inputs, targets = mask_batch(b_ids, b_mask, self.vocab, self.rate, self.span_mean,
                                         batch_generator(seed, epoch or 0, i))
            yield inputs, b_mask, targets

    def forward_args(self, targets: torch.Tensor, device) -> Dict[str, Any]:
        return {"positions": (targets.reshape(-1) != IGNORE).nonzero().squeeze(1).to(device)}

    def scored(self, targets: torch.Tensor) -> torch.Tensor:
        flat = targets.reshape(-1)
        return flat[flat != IGNORE]

    def loss(self, out, scored, dd, weight, global_size):
        if scored.numel() == 0:         # shape metadata: no device read
            return out.logits.float().sum() * 0.0
        return super().loss(out, scored, dd, weight, global_size)

    def metrics(self, accuracy: float, loss: float, info, tensors, splits) -> Dict[str, Any]:
        counts = torch.bincount(torch.cat([self.scored(t) for _, _, t in self.batches(
            tensors["test"], self.cfg["train"]["batch_size"])]), minlength=len(self.vocab))
        return {"masked_accuracy": accuracy, "masked_loss": loss, "perplexity": math.exp(min(loss, 700.0)),
                "unigram_masked_accuracy": float(counts.max() / counts.sum().clamp_min(1)),
                "mask_rate": self.rate, "span_mean": self.span_mean, "head": self.head_kind, **info}
