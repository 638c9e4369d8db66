"""The one place that says what each test matrix runs, drawn from the registries.

Each registered penalty (`energies.RHOS`) declares example specs by regime (`Rho.examples`: ``typical``, and where
they apply ``steep``, ``linear``, ``wide``). A matrix names the regimes it runs; every registered rho contributes
the examples of those regimes it declares, or its typical example where it declares none of them (a rho that
declares no example at all runs its bare name). A new rho is therefore in every matrix the moment it is registered,
in the test files and the scripts alike, with no list to edit.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from energies.rho import RHOS

#: matrix -> the regimes it runs, and who reads it
MATRICES: Dict[str, Tuple[str, ...]] = {
    # kernels agree with the edge list, steps descend, the descent sweep (test_backends, test_steps, sweep.py)
    "kernels": ("typical", "steep"),
    # every energy term's value, gradient, curvature bound (test_energy): the concave boundary too
    "energy": ("typical", "steep", "linear"),
    # the banded kernel on shift-invariant graphs (test_banded): a second scale of the parameters
    "banded": ("wide",),
    # shapes on the meta device, the build check against the build (test_meta, test_hostile_library)
    "shapes": ("typical", "steep"),
    # one example a penalty: the PyG conv (test_pyg), the Triton check run by hand (triton_check_matrix.py)
    "families": ("typical",),
}


def rho_examples(name: str) -> Dict[str, str]:
    """The example specs of the registered rho ``name`` by regime (``{"typical": name}`` where it declares none)."""
    declared = dict(getattr(RHOS[name], "examples", None) or {})
    declared.setdefault("typical", name)
    return declared


def rho_specs(matrix: str) -> List[str]:
    """The rho specs the matrix runs, in registration order (each rho's in the order of the matrix's regimes)."""
    regimes = MATRICES[matrix]
    specs: List[str] = []
    for name in RHOS:
        examples = rho_examples(name)
        chosen = [examples[r] for r in regimes if r in examples] or [examples["typical"]]
        specs += [s for s in chosen if s not in specs]
    return specs
