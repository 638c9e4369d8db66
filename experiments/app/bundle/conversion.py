"""Converting a bundle to the current format: `convert` writes the model of a bundle of any format (format 1:
``best.pt`` or ``model.pt``, ``config.yaml``, no card; or, on request, a run folder from before bundles) as a
format-2 bundle, verified (the same weights bit for bit, the same predictions and energies on probe texts)
before it is put in place; the old bundle is only read. Its command line: `experiments.app.bundle.cli`.
"""
from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil

from energies.errors import CheckpointError

from .model import TrainedModel, graph_to_save, load_model, path_arg, quiet_predictions, state_to_save
from .write import write_read_back

#: texts every conversion is checked on (besides the vocabulary's first words): the predictions and energies of
#: the converted bundle must equal the original's exactly
PROBES = ("", "good", "a text of several words that the model may or may not know", "zzzz-unknown-token")
#: the conversion's command line (`experiments.app.bundle.cli`), recorded as the command of a bundle that has none
CONVERT_CMD = "python -m experiments.app.bundle convert"


def convert(old: str, new: str, legacy: bool = False) -> str:
    """Write the model of the bundle ``old`` (any format `load_model` reads; ``legacy``: a run folder from
    before bundles) as a format-2 bundle at ``new``, which must not exist or be an empty folder. ``old`` is only
    read. The bundle is written into a staging folder beside ``new`` (``.NAME.<random>.convert``, locked while it
    is in use), read back, and checked -- the same weights bit for bit, and the same probabilities and per-layer
    energies as ``old``'s on probe texts -- before it is renamed to ``new``; on any failure or interruption the
    staging folder is removed and nothing is left at ``new``. A staging folder of ``new`` left by a killed
    conversion (its lock no longer held) is removed first. Returns ``new``."""
    old = path_arg(old, "OLD", "convert")
    new = path_arg(new, "NEW", "convert", output=True)
    src, dst = os.path.realpath(old), os.path.realpath(new)
    if dst == src or dst.startswith(src + os.sep):
        raise CheckpointError(f"convert: NEW {new!r} is {'OLD itself' if dst == src else 'inside OLD'} ({old!r}); "
                              "the old bundle is never changed: name a new folder outside it")
    if os.path.lexists(new) and (os.path.islink(new) or not os.path.isdir(new) or os.listdir(new)):
        raise CheckpointError(f"convert: {new!r} exists and is not an empty folder; name a new folder (nothing is "
                              "replaced)")
    trained = load_model(old, legacy=legacy)
    if trained.command is None:
        trained.command = f"{CONVERT_CMD} {shlex.quote(old)} {shlex.quote(new)}" + (" --legacy" if legacy else "")
    parent, base = os.path.split(os.path.abspath(new))
    os.makedirs(parent, exist_ok=True)
    _remove_stale_stages(parent, base)
    stage, lock = None, None
    try:
        while stage is None:           # named before it exists: an interruption from here on finds it below
            stage = os.path.join(parent, f".{base}.{secrets.token_hex(6)}{CONVERT_SUFFIX}")
            try:
                os.mkdir(stage, 0o700)
            except FileExistsError:    # someone else's (48 random bits): not ours to remove
                stage = None
        lock = _convert_lock(stage)
        write_read_back(trained, state_to_save(trained, new), graph_to_save(trained), stage, new)
        _same_predictions(trained, load_model(stage), old)
        os.unlink(os.path.join(stage, ".lock"))    # still held through its descriptor until the rename is done
        os.chmod(stage, 0o755)         # the staging folder is private; a bundle is made to be shared
        if os.path.isdir(new):
            os.rmdir(new)              # empty (checked above)
        os.rename(stage, new)
        stage = None
    finally:
        if lock is not None:
            lock.release()
        if stage is not None and os.path.isdir(stage) and not os.path.islink(stage):
            shutil.rmtree(stage, ignore_errors=True)
    return new


#: the suffix of `convert`'s staging folders
CONVERT_SUFFIX = ".convert"


def _convert_lock(stage: str):
    """The run lock of a conversion's staging folder, held until the conversion ends: a staging folder whose lock
    is not held was left by a killed conversion (`_remove_stale_stages`)."""
    from ...runfolder.runlock import RunLock

    return RunLock(stage).acquire()


def _remove_stale_stages(parent: str, base: str) -> None:
    """Remove the staging folders of ``parent/base`` that killed conversions left: named as `convert` names them
    (or as it named them before: ``tempfile.mkdtemp``'s eight characters), real folders, holding a lock file that
    no process holds. A folder without a lock file may be a conversion that is just starting: it is left alone."""
    from ...runfolder.runlock import lock_owner

    pattern = re.compile(re.escape(f".{base}.") + r"(?:[0-9a-f]{12}|[a-z0-9_]{8})" + re.escape(CONVERT_SUFFIX))
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        if not pattern.fullmatch(name) or os.path.islink(path) or not os.path.isdir(path):
            continue
        owner = lock_owner(path)
        if owner is not None and not owner.held:
            shutil.rmtree(path, ignore_errors=True)


def _same_predictions(trained: TrainedModel, back: TrainedModel, old: str) -> None:
    """Refuse a converted bundle that does not predict as the original on the probe texts (probabilities,
    per-layer energies, verdicts), or whose label names or config differ. The probes are predicted without the
    warnings `TrainedModel.predict` gives for texts with no known word: they are this check's own texts."""
    probes = list(PROBES) + [" ".join(trained.vocab.itos[2:12])]
    a, b = quiet_predictions(trained, probes), quiet_predictions(back, probes)
    same = all(p.probabilities == q.probabilities and p.energies == q.energies and p.verdict == q.verdict
               for p, q in zip(a, b))
    if not same or back.label_names != trained.label_names or back.config != trained.config:
        raise CheckpointError(f"convert: the converted bundle does not predict as {old!r} does; nothing written")
