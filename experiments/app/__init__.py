"""The application a user runs: a config in, a run folder out, and the trained model used.

* `config` (every key's rule; choices read from the library's registries; shipped configs by name) and
  `strict_yaml` (the one strict YAML reader);
* `build`: a model (and its data) built from a config, the one place training and bundles build from;
* `train` (``unfold-train``: the loop), `.tasks` (what a run learns: ``classify``, ``masked_tokens``; a
  registry), `.evaluation` (accuracy, loss, the float64 descent check), `.runfiles` (the run folder's files),
  `distributed` (DDP under ``torchrun``), `checkpoint` and
  `checkpoint_fields` (crash-safe, checksummed checkpoints), `fingerprint` (the data a run trained on),
  `throughput`, `runlock` (one owner per run folder), `runlog` (log file, ``metrics.csv``,
  TensorBoard), `atomic` (crash-safe writes), `plot_energy` (a run's plots);
* `bundle` (a trained model in one folder), `predict` (``unfold-predict``) and `.fill_mask` (a
  masked-token model's answers);
* `sweep` (``unfold-sweep``: seed sweeps) and `tfidf` (the TF-IDF baseline ``unfold-sweep --tfidf``
  runs).

May import: the library ([`energies`][energies], [`unfold`][unfold], [`convex`][convex]), `experiments.data` and its own
modules; never `experiments.studies` nor the alias modules of `experiments`.
"""
