"""Experiments on the library: the application a user runs and the studies that reproduce the papers' claims.

* `experiments.app`: the application (config, data through `experiments.data`, model building,
  training, checkpoints, run folders and logs, bundles, prediction, seed sweeps, the TF-IDF baseline);
* `experiments.data`: the data package of the application (``unfold-data``);
* `experiments.studies`: paper reproductions and measurements of the project (descent sweep, spline probe,
  activations, convex heads, PyG example, benchmarks, graph variants, depth);
* ``configs/``: the shipped configs (package data, found by name);
* the modules directly here (``train``, ``predict``, ``sweep``, ``bench``, ...) are aliases of their homes in
  `experiments.app` or `experiments.studies`, kept so that every documented ``python -m experiments.X``
  command and import path keeps working; they hold no code.

Layers: `experiments.app` and `experiments.data` may import the library ([`energies`][energies], [`unfold`][unfold],
[`convex`][convex]) and each other's modules, never a study; a study may import the library, the application and other
studies; nothing here is imported by the library (``tests/test_layering.py`` checks all of it).
"""
