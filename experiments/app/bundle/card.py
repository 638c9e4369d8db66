"""The model card: a bundle's ``README.md`` (`model_card`), and what it records of ``bundle.json``
(`card_binding`).

A format-2 card carries in its front matter (key `CARD_KEY`) the sha256 of every field of ``bundle.json``
(`BOUND_KEYS`: format, version, weights, label names, dataset, fingerprint, graph, metrics, command; ``task``
where there is one) and of every other file, and ``bundle.json`` hashes the card: the card's hash is the root of
trust, so a field edited without rewriting the card is refused on load, naming it (the metrics a bundle reports
are the card's). A card written before cards recorded these digests must be exactly the card of the manifest's
fields (`experiments.app.bundle.read` checks both).
"""
from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Optional, Sequence

from unfold.strict_json import dumps as json_dumps

from ..graph_pin import is_graph_file
from .format import CARD, task_name, vocab_file

#: the manifest's fields the model card binds (`card_binding`): everything but the card's own digest
BOUND_KEYS = ("format", "version", "weights", "label_names", "dataset", "data_fingerprint", "graph", "metrics",
              "command")
#: the card's front-matter key holding the binding
CARD_KEY = "bundle_sha256"


def canonical_sha256(value: Any) -> str:
    """The sha256 of ``value`` as canonical JSON (sorted keys, no spaces, ASCII): the same for the same data
    whichever file it was read from."""
    return hashlib.sha256(json_dumps(value, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=True).encode("ascii")).hexdigest()


def card_binding(manifest: Dict[str, Any]) -> Dict[str, Any]:
    """What a format-2 model card records of its ``bundle.json`` (front-matter key `CARD_KEY`): the sha256
    of each field of `BOUND_KEYS` (canonical JSON) and the sha256 of every other file of the bundle.
    ``bundle.json`` hashes the card, so its hash of the card is the root of trust: a field of ``bundle.json``
    (label names, fingerprint, metrics, ...) or a file hash edited without rewriting the card is refused on load.
    """
    return {"fields": {k: canonical_sha256(manifest.get(k)) for k in bound_keys(manifest)},
            "files": {n: manifest["sha256"][n] for n in sorted(manifest["sha256"]) if n != CARD}}


def bound_keys(*records: Dict[str, Any]) -> tuple:
    """`BOUND_KEYS`, and ``task`` where one of ``records`` (a manifest, a card's recorded fields) has it: a
    classifier's manifest has none, and its card binds what it always did."""
    return BOUND_KEYS + (("task",) if any("task" in r for r in records) else ())


def _front_matter(doc: Dict[str, Any]) -> str:
    """``doc`` as a card's YAML front matter, between two ``---`` lines."""
    import yaml

    return "---\n" + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True) + "---\n"


def model_card(config: Dict[str, Any], label_names: Sequence[str], dataset: Optional[str],
               fingerprint: Optional[Dict[str, Any]], metrics: Optional[Dict[str, Any]],
               command: Optional[str], binding: Optional[Dict[str, Any]] = None,
               names_checkpoint: bool = True) -> str:
    """The bundle's ``README.md``: Hugging Face front matter (library_name, tags, datasets where the dataset is a
    name rather than a path, metrics, pipeline tag; ``binding``, where given: the digests of ``bundle.json``'s
    fields and of the other files, `card_binding`, under `CARD_KEY`), then what the model is, its test
    metrics and the checkpoint they were measured on (`checkpoint_sentence`), the descent verdict and the
    tolerance rule it was decided by, the data fingerprint, the command that made it, how to load it, and the
    config. Written from the bundle's own fields only, so the same bundle always gets the same card.
    ``names_checkpoint=False``: the card as it was written before cards named that checkpoint (what a card
    without `CARD_KEY`, older still, is checked against)."""
    m = dict(metrics or {})
    mode, task = config["model"]["mode"], task_name(config)
    pipeline = "text-classification" if task is None else "fill-mask"
    front: Dict[str, Any] = {"library_name": "unfolded-transformers",
                             "tags": ["unfolded-transformer", "energy-based", pipeline, "safetensors",
                                      f"mode-{mode}", "model_hub_mixin"] + ([f"task-{task}"] if task else []),
                             "pipeline_tag": pipeline}
    if dataset and not any(c in dataset for c in "/\\:") and not dataset.startswith("."):
        front["datasets"] = [dataset]
    front["metrics"] = ["accuracy"]
    if binding is not None:
        front[CARD_KEY] = binding
    lines = [f"# {config.get('name', 'model')}: an energy-based unfolded transformer ({mode})", "",
             (f"A text classifier over {len(label_names)} classes ({', '.join(map(str, label_names))})" if task is None
              else f"A masked-token model (`task: {task}`: pretrained to predict the masked tokens of its training "
                   "texts; `unfold-predict PATH --text \"a [MASK] film\"` fills the mask)") + " whose layers "
             "are steps that lower an energy (unfolded optimisation). Files: `model.safetensors` (weights), "
             f"`config.json` (resolved config), `{vocab_file(config)}`, `bundle.json` (format, label names, sha256 of every "
             "file)" + (", `graph.npy` (the token graph trained on)" if is_graph_file(config["model"]["graph"])
                         else "") + ".", "", "## Descent verdict", ""]
    if m.get("init_from"):
        lines[2:2] = [f"Fine-tuned from `{m['init_from']}` (task `{m.get('init_from_task')}`, data fingerprint "
                      f"sha256 `{m.get('init_from_fingerprint_sha256')}`): its tokenizer, embedding and encoder, "
                      "with a new head.", ""]
    lines += _card_verdict(m, config, task)
    sentence = checkpoint_sentence(m, config["train"]["epochs"]) if names_checkpoint else None
    if sentence:
        at = lines.index("## Test metrics") + 2
        lines[at:at] = [sentence, ""]
    lines += _card_tail(config, dataset, fingerprint, command, task)
    return _front_matter(front) + "\n" + "\n".join(lines)


def checkpoint_sentence(metrics: Optional[Dict[str, Any]], epochs: int) -> Optional[str]:
    """The sentence naming the weights a run's test figures were measured with: the best-validation checkpoint
    (``best.pt``, what the bundle holds), its epoch of the run's ``epochs`` (``train.epochs``) and validation
    accuracy, and whether it is the last epoch's, read from ``metrics`` (``metrics.json``'s ``best_epoch`` and
    ``val_accuracy``, or a card's); None where no ``best_epoch`` is recorded (a bundle not written at the end of a
    run). The trainer logs it as its last line; the model card states it above its test metrics."""
    m = metrics or {}
    best, val = m.get("best_epoch"), m.get("val_accuracy")
    if isinstance(best, bool) or not isinstance(best, int) or best < 1:
        return None
    score = (f"validation accuracy {val:.4f}" if isinstance(val, (int, float)) and not isinstance(val, bool)
             else "validation accuracy not recorded")
    if best >= epochs:
        return (f"The test figures are those of the best-validation checkpoint: epoch {best} of {epochs}, the last "
                f"({score}).")
    return (f"The test figures are those of the best-validation checkpoint: epoch {best} of {epochs} ({score}), "
            f"not the last epoch's weights: validation did not improve after epoch {best}.")


def _card_verdict(m: Dict[str, Any], config: Dict[str, Any], task: Optional[str] = None) -> List[str]:
    """The card's lines from the descent verdict to the test metrics' table (``m``: the card's metrics; ``task``:
    the model's task where it is not classify, whose check ran on held-out training texts)."""
    lines: List[str] = []
    verdict = m.get("energy_verdict")
    if verdict is None:
        lines.append("Not recorded (this bundle was not written at the end of a training run).")
    else:
        lines.append(f"**{verdict}**: {m.get('energy_increases', '?')} energy increases beyond tolerance and "
                     f"{m.get('energy_nonfinite', '?')} non-finite values in {m.get('energy_steps', '?')} layer-steps "
                     f"on {'the test split' if task is None else 'the held-out training texts, masked'}, checked in "
                     f"{config['train']['check_dtype']} "
                     f"(largest relative increase {m.get('energy_max_rel_increase', '?')}).")
        if "train_energy_steps" in m:
            lines.append(f"During training: {m.get('train_energy_increases', '?')} increases in "
                         f"{m['train_energy_steps']} layer-steps.")
    lines += ["", "Tolerance rule: " + (f"`{m['energy_tol_rule']}`" if m.get("energy_tol_rule") else
                                        "E_t+1 > E_t + tol is an increase, tol tied to the dtype and to the size "
                                        "of the energy (unfold.trace.report_from_values)."),
              "", "## Test metrics", ""]
    shown = [k for k in ("test_accuracy", "test_loss", "val_accuracy", "best_epoch", "majority_class_accuracy",
                         "no_better_than_majority", "check_dtype_test_accuracy", "masked_accuracy", "masked_loss",
                         "perplexity", "unigram_masked_accuracy", "check_dtype_accuracy", "pretrain_texts",
                         "heldout_texts", "head", "params") if k in m]
    if shown:
        lines += ["| metric | value |", "|---|---|"] + [f"| {k} | {m[k]} |" for k in shown]
    else:
        lines.append("Not recorded.")
    return lines


#: the card's "Use" lines of each task: how to load the bundle and what to ask it
_USE = {None: ['for p in model.predict(["a text to classify"]):', "    print(p.label, p.probabilities, p.verdict)",
               "```", "", "or `unfold-predict PATH --text \"...\"`."],
        "masked_tokens": ['for p in model.predict(["a [MASK] film"], top_k=5):      # fill-mask',
                          "    print([(c.token_str, c.score) for c in p.masks[0]], p.verdict)", "```", "",
                          "or `unfold-predict PATH --text \"a [MASK] film\" --top-k 5`; fine-tune it with "
                          "`unfold-train --config CONFIG model.init_from=PATH`."]}


def _card_tail(config: Dict[str, Any], dataset: Optional[str], fingerprint: Optional[Dict[str, Any]],
               command: Optional[str], task: Optional[str] = None) -> List[str]:
    """The card's lines from the data section to the end: data (and the unlabelled texts pretrained on, where
    ``data.texts`` names them), command, use (``task``'s: classify or fill-mask), config."""
    texts = (config.get("data") or {}).get("texts") if task else None
    return ["", "## Data", "", f"Dataset: `{dataset}`" if dataset else "Dataset: not recorded", "",
            *([f"Pretrained on the unlabelled texts of `{texts}` (one text a line, read as a stream).", ""]
              if texts else []),
            "Data fingerprint (sha256 of the vocabulary, of each split and of the label names the model was "
            "trained on, with their sizes: `experiments.runfolder.fingerprint`):",
            "", "```json", json_dumps(fingerprint, indent=1, ensure_ascii=False), "```", "",
            "## The command that made it", "", f"```\n{command}\n```" if command else "Not recorded.", "",
            "## Use", "", "```python", "from experiments.app.bundle import TrainedModel", "",
            'model = TrainedModel.from_pretrained("PATH_OR_HUB_ID")   # no pickle, no code: safetensors + JSON',
            *_USE.get(task, _USE[None]), "", "## Config", "", "```json",
            json_dumps(config, indent=1, ensure_ascii=False), "```", ""]
