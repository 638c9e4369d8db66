"""Studies: the papers' claims reproduced and the project measured, each a ``python -m`` command.

* :mod:`.descent`: the energy-descent sweep over graphs, rho and step sizes (with the printed update as the
  negative control);
* :mod:`.spline_probe` and :mod:`.activations`: is attention a spline, and softmax / ReLU / softplus attention
  trained side by side;
* :mod:`.convex_heads`: convex heads on frozen features, solved to certified optimality;
* :mod:`.pyg_sbm`: node classification with ``UnfoldedAttentionConv`` on a stochastic block model;
* :mod:`.bench`: benchmarks against reference implementations, as ratios;
* :mod:`.variants` (``unfold-variants``): token graphs compared by accuracy, throughput and energy;
* :mod:`.depth`: depth chosen by the energy on a finished run.

May import: the library, the application (:mod:`experiments.app`, :mod:`experiments.data`) and other studies;
nothing imports a study but another study, its alias in :mod:`experiments` and the tests.
"""
