"""Experiments: descent sweeps and plots (training, benchmarks and graph variants follow)."""
