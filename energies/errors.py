"""Exception types of the framework, one per kind of bad input.

Every public entry point raises one of these with a message that names the
field and the offending value, never a raw error from deep inside torch.
All derive from [`UnfoldError`][energies.UnfoldError], itself a `ValueError`, so callers
that already catch ``ValueError`` keep working.
"""


class UnfoldError(ValueError):
    """Base class of every error the framework raises on bad input."""


class TokenError(UnfoldError):
    """A token tensor has the wrong shape or dtype, or holds NaN/Inf."""


class GraphError(UnfoldError):
    """A token graph is malformed: edge out of range, self loop, repeated edge, bad mask."""


class EnergyError(UnfoldError):
    """An energy term got out-of-range parameters (tau <= 0, unknown rho, bad weight)."""


class StepError(UnfoldError):
    """An update step got out-of-range parameters (alpha outside (0, 1], bad step size)."""


class ConfigError(UnfoldError):
    """An unknown or ill-typed configuration key or command-line option."""


class InputError(TokenError, ConfigError):
    """A model's input tensor (token ids, tokens, padding mask) is malformed: wrong shape or device, an empty batch,
    an example with no real token. A [`TokenError`][energies.TokenError]; also a [`ConfigError`][energies.ConfigError],
    the name under which the encoders refused these inputs before, so that callers catching either keep working."""


class DescentError(UnfoldError):
    """A layer whose descent is guaranteed raised its energy (strict descent monitor), confirmed in float64."""


class CheckpointError(UnfoldError):
    """No checkpoint of a run can be loaded (missing, corrupt, or from another config)."""
