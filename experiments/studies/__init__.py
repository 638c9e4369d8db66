"""Studies: the papers' claims reproduced and the project measured, each a ``python -m`` command.

* `descent`: the energy-descent sweep over graphs, rho and step sizes (with the printed update as the
  negative control);
* `spline_probe` and `activations`: is attention a spline, and softmax / ReLU / softplus attention
  trained side by side;
* `convex_heads`: convex heads on frozen features, solved to certified optimality;
* `pyg_sbm`: node classification with ``UnfoldedAttentionConv`` on a stochastic block model;
* `bench`: benchmarks against reference implementations, as ratios;
* `variants` (``unfold-variants``): token graphs compared by accuracy, throughput and energy;
* `depth`: depth chosen by the energy on a finished run;
* `figures`: the pages' measured figures regenerated from (and checked against) the JSONs that hold them.

May import: the library, the application (`experiments.app`, `experiments.data`) and other studies;
nothing imports a study but another study, its alias in `experiments` and the tests.
"""
