"""The application a user runs: a config in, a run folder out, and the trained model used.

* :mod:`.config` (every key's rule; choices read from the library's registries; shipped configs by name) and
  :mod:`.strict_yaml` (the one strict YAML reader);
* :mod:`.build`: a model (and its data) built from a config, the one place training and bundles build from;
* :mod:`.train` (``unfold-train``: the loop), `.tasks` (what a run learns: ``classify``, ``masked_tokens``; a
  registry), `.evaluation` (accuracy, loss, the float64 descent check), `.runfiles` (the run folder's files),
  :mod:`.distributed` (DDP under ``torchrun``), :mod:`.checkpoint` and
  :mod:`.checkpoint_fields` (crash-safe, checksummed checkpoints), :mod:`.fingerprint` (the data a run trained on),
  :mod:`.throughput`, :mod:`.runlock` (one owner per run folder), :mod:`.runlog` (log file, ``metrics.csv``,
  TensorBoard), :mod:`.atomic` (crash-safe writes), :mod:`.plot_energy` (a run's plots);
* :mod:`.bundle` (a trained model in one folder), :mod:`.predict` (``unfold-predict``) and `.fill_mask` (a
  masked-token model's answers);
* :mod:`.sweep` (``unfold-sweep``: seed sweeps) and :mod:`.tfidf` (the TF-IDF baseline ``unfold-sweep --tfidf``
  runs).

May import: the library (:mod:`energies`, :mod:`unfold`, :mod:`convex`), :mod:`experiments.data` and its own
modules; never :mod:`experiments.studies` nor the alias modules of :mod:`experiments`.
"""
