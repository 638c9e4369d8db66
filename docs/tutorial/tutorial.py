# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Tutorial: train an unfolded transformer, watch its energy fall, compare two graphs, predict
#
# Every layer of an unfolded transformer is one majorization-minimization step on an explicit energy
# E(Y) of the token matrix, so the energy must fall from layer to layer. This notebook trains a small model on
# a dataset written here (a CSV of your own would be read the same way), looks at its energy per layer,
# trains the same model on a sparse token graph to compare, and predicts with the saved model.
#
# It runs offline on a CPU in about a minute. The test suite executes it (`tests/test_tutorial.py`), and
# `python scripts/run_tutorial.py OUT_DIR` writes the executed notebook and its figures into OUT_DIR
# (`--update-docs`: into `docs/tutorial/`).

# %%
import atexit
import csv
import json
import os
import random
import shutil
import tempfile

import matplotlib.pyplot as plt
import numpy as np

from experiments.app.bundle import TrainedModel
from experiments.app.config import load_config
from experiments.app.plot_energy import load_trace
from experiments.app.train import train

work = os.environ.get("TUTORIAL_WORK")                 # the data and run folders (the runner's temporary folder)
if not work:                                           # run by hand: a temporary folder removed when the kernel exits
    work = tempfile.mkdtemp(prefix="unfold-tutorial-")
    atexit.register(shutil.rmtree, work, ignore_errors=True)
FIGURES = os.environ.get("TUTORIAL_FIGURES", work)     # where the figures are saved (docs/tutorial/ for the docs)
os.makedirs(FIGURES, exist_ok=True)

# %% [markdown]
# ## 1. A dataset of your own: a CSV with a text column and a label column
#
# Short reviews built from a few positive and negative words among neutral ones. The column names are not the
# defaults (`text`, `label`): the config keys `data.text_field` and `data.label_field` name them.

# %%
rng = random.Random(0)
POSITIVE = "great superb moving delightful brilliant charming".split()
NEGATIVE = "dull awful tedious clumsy boring bland".split()
NEUTRAL = "the film a story plot actors scene with and of this it was".split()


def review(positive: bool) -> str:
    words = rng.sample(NEUTRAL, 6) + rng.sample(POSITIVE if positive else NEGATIVE, 2)
    rng.shuffle(words)
    return " ".join(words)


data = os.path.join(work, "reviews.csv")
with open(data, "w", newline="") as fh:
    out = csv.writer(fh)
    out.writerow(["body", "topic"])
    for i in range(600):
        positive = i % 2 == 0
        out.writerow([review(positive), "positive" if positive else "negative"])
print(open(data).read().splitlines()[:3])

# %% [markdown]
# ## 2. Train: a shipped config, with overrides
#
# `load_config` takes a shipped config's name (or a YAML file) and `section.key=value` overrides, exactly as
# `unfold-train --config tiny data.dataset=...` does. `train` writes the run folder, which is also a bundle
# (the model, its config, vocabulary and a model card) and returns the run's metrics.

# %%
overrides = [f"data.dataset={data}", "data.text_field=body", "data.label_field=topic", "data.glove=none",
             "train.epochs=6", "train.lr=0.005", "train.batch_size=32", "train.progress=false",
             "train.device=cpu", "model.layers=4"]
cfg = load_config("tiny", overrides)
complete_run = os.path.join(work, "complete")
metrics = train(cfg, complete_run)
print(json.dumps({k: metrics[k] for k in ("test_accuracy", "majority_class_accuracy", "energy_verdict",
                                          "energy_steps", "energy_increases")}, indent=1))

# %% [markdown]
# ## 3. The energy at every layer
#
# `energy_trace.pt` holds the float64 energy of every test example at every layer, term by term (the
# trainer's descent check). The total must fall at every layer; one term alone may rise while the others fall
# more. The run also drew this as `energy_descent.png`.

# %%
trace = load_trace(os.path.join(complete_run, "energy_trace.pt"))
terms = {name: values.numpy() for name, values in trace["energies"].items()}
total = sum(terms.values())
layers = np.arange(total.shape[1])
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
left.plot(layers, total.T[:, :40], color="tab:blue", alpha=0.3)
left.plot(layers, total.mean(0), color="black", marker="o", label="mean")
left.set(title="total energy per test example: falls at every layer", xlabel="layer t", ylabel="E(Y_t)")
left.legend()
left.set_xticks(layers)
right.set_xticks(layers)
for name, values in terms.items():
    right.plot(layers, values.mean(0), marker="o", label=name)
right.set(title="mean of each term (a part may rise)", xlabel="layer t")
right.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(FIGURES, "energy_per_layer.png"), dpi=90)
increases = int((np.diff(total, axis=1) > 0).sum())
print(f"{total.shape[0]} test examples x {total.shape[1] - 1} layers; steps where the total rose: {increases} "
      f"(the checker, with its rounding tolerance: {metrics['energy_increases']})")

# %% [markdown]
# ## 4. Another token graph: a sliding window
#
# The same model with attention restricted to a window of radius 2 around each token (`model.graph=window:2`):
# the energy is then a sum over the window's edges only, and the layers still descend it.

# %%
window_run = os.path.join(work, "window")
window_metrics = train(load_config("tiny", overrides + ["model.graph=window:2"]), window_run)
fig, ax = plt.subplots(figsize=(5.5, 3.6))
for name, run in (("complete graph", complete_run), ("window:2", window_run)):
    energies = load_trace(os.path.join(run, "energy_trace.pt"))["energies"]
    per_layer = sum(v.numpy() for v in energies.values()).mean(0)
    ax.plot(np.arange(len(per_layer)), per_layer, marker="o", label=name)
ax.set(title="mean total energy per layer, two token graphs", xlabel="layer t", ylabel="mean E(Y_t)",
       xticks=np.arange(len(per_layer)))
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(FIGURES, "two_graphs.png"), dpi=90)
for name, m in (("complete", metrics), ("window:2", window_metrics)):
    print(f"{name:9s} test accuracy {m['test_accuracy']:.3f}, verdict {m['energy_verdict']}, "
          f"{m['energy_increases']} increases in {m['energy_steps']} layer-steps")

# %% [markdown]
# ## 5. Predict with the saved model
#
# The run folder is a bundle: `TrainedModel.from_pretrained` loads it (safetensors weights, no code executed)
# and `predict` gives each text's label, probabilities, energy per layer with its descent verdict, and how many
# of its words the model has never seen. A text of unknown words only is the model's prior, and says so.

# %%
model = TrainedModel.from_pretrained(complete_run)
for p in model.predict(["a brilliant and moving story", "dull clumsy plot", "zzz qqq"]):
    print(f"{p.label:9s} {max(p.probabilities.values()):.2f}  verdict={p.verdict}  "
          f"unknown {p.unknown_tokens}/{p.tokens}{'  (prior only)' if p.prior_only else ''}  {p.text!r}")
