"""Use a trained model on new text: ``python -m experiments.predict RUN_DIR --text "..." [--file F] [--json]``.

For each text: the label name, the class probabilities, and the energy E(Y_t) at every layer boundary
(float64 by default, ``train.check_dtype``) with the descent check (increases beyond the tolerance, non-finite
steps, verdict). ``--json`` prints one JSON object a line (keys ``text``, ``label``, ``label_id``,
``probabilities``, ``energies``, ``energy_terms``, ``increases``, ``nonfinite``, ``descent``, ``verdict``,
``tokens``); ``--plot OUT.png`` draws each text's per-layer energy; ``--layers K`` unrolls the shared step K
times instead of the trained depth (weight-shared encoders only: refused for untied free/baseline stacks). The same as the Python call
``experiments.app.bundle.load_model(RUN_DIR).predict(texts)``. Exit status 0, or 2 for bad input (no such run,
no text, a changed bundle, a ``--plot`` path that cannot be written), with nothing written and nothing printed
on stdout: ``--plot``'s folder is checked (a real write probe) before the model is loaded, and the figure is
written before any prediction is printed, so a failure never leaves half an answer. ``--legacy`` reads a run
folder from before bundles (no ``bundle.json``; unverified: see :mod:`experiments.app.bundle`).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Sequence

from energies.errors import ConfigError
from unfold.cli import check_device, folder_arg, folder_problem, positive_int, run_main
from unfold.encoders import check_inference_layers
from unfold.plugins import add_import_arg
from unfold.strict_json import dumps as json_dumps

from .atomic import atomic_open
from .bundle import Prediction, load_model

PROG = "python -m experiments.predict"


def _decode(data: bytes, where: str) -> str:
    """``data`` as strict UTF-8 (the one reading rule of ``--file PATH`` and ``--file -``): invalid bytes are a
    :class:`ConfigError` naming ``where``, the byte offset and the line, never surrogate escapes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}, line {line})") from None


def read_texts(texts: Sequence[str], files: Sequence[str]) -> List[str]:
    """``--text`` values, then the lines of each ``--file`` (``-`` is stdin; blank lines skipped). Files and stdin
    are read as bytes and decoded as strict UTF-8 alike (:func:`_decode`); a ``--text`` that is not valid Unicode
    (an argument of invalid UTF-8 bytes reaches Python as lone surrogates) is refused the same way."""
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise ConfigError(f"--text number {empty[0] + 1} is empty: there is nothing to classify")
    for i, t in enumerate(texts):
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"--text number {i + 1}: not UTF-8 text (a lone surrogate {t[exc.start]!a} at "
                              f"character {exc.start}: the argument's bytes are not UTF-8)") from None
    out = list(texts)
    for path in files:
        if path == "-":
            stream = getattr(sys.stdin, "buffer", None)
            data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
            lines = _decode(data, "--file - (stdin)").splitlines()
        else:
            with open(path, "rb") as fh:
                lines = _decode(fh.read(), f"--file {path}").splitlines()
        out.extend(line for line in lines if line.strip())
    if not out:
        raise ConfigError("no text to classify: give --text TEXT or --file FILE (one text a line)")
    return out


#: the plain output's escapes: a backslash, and every character that would end a line or a tab-separated field
#: (str.splitlines' separators and the other C0/C1 controls), so that each text is one line and one field
_ESCAPES = {ord("\\"): "\\\\", ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}


def escape_field(text: str) -> str:
    """``text`` as one field of the plain output: ``\\`` for a backslash, ``\\t``, ``\\n``, ``\\r`` for tab,
    newline and carriage return, ``\\xHH`` for the other control characters (U+0000-U+001F, U+007F-U+009F) and
    ``\\uHHHH`` for the line and paragraph separators U+2028, U+2029 (Python's string escapes: ``codecs.decode(field,
    "unicode_escape")`` does not undo UTF-8, but ``field.encode("latin-1", "backslashreplace").decode(
    "unicode_escape")`` does); every other character as it is."""
    out = []
    for ch in text:
        o = ord(ch)
        if o in _ESCAPES:
            out.append(_ESCAPES[o])
        elif o < 0x20 or 0x7F <= o <= 0x9F:
            out.append(f"\\x{o:02x}")
        elif o in (0x2028, 0x2029):
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    return "".join(out)


def json_line(obj) -> str:
    """``obj`` as one line of JSON, UTF-8 as it is, but for the three characters JSON leaves raw that end a line
    for ``str.splitlines`` (U+0085, U+2028, U+2029): written as ``\\uXXXX`` (they can only occur in strings)."""
    text = json_dumps(obj, ensure_ascii=False)
    return text.replace("\x85", "\\u0085").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def check_plot_path(path: str) -> None:
    """Refuse (:class:`ConfigError` naming ``--plot`` and the path) a figure path that cannot be written: not
    ``*.png``, a folder, or in a folder that cannot be created or written (probed by creating and removing a
    temporary file: right for permissions, read-only mounts and root alike)."""
    if not path.lower().endswith(".png"):
        raise ConfigError(f"--plot {path!r}: the figure is a PNG file, name it *.png")
    if "\0" in path:
        raise ConfigError(f"--plot {path!r}: not a usable path (it holds a NUL byte)")
    if os.path.isdir(path):
        raise ConfigError(f"--plot {path!r} is a folder, not a file")
    parent = os.path.dirname(os.path.abspath(path))
    why = folder_problem(parent, writable=True)
    if why:
        raise ConfigError(f"--plot {path!r} cannot be written: its folder {parent!r} {why}")


def plot_energies(predictions: Sequence[Prediction], path: str, max_chars: int = 40) -> None:
    """One line per text: E(Y_t) against the layer t, relative to E(Y_0) (the texts' energies differ in scale),
    an increase marked with a red cross; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for p in predictions:
        e0 = p.energies[0]
        scale = abs(e0) if e0 else 1.0
        rel = [(e - e0) / scale for e in p.energies]
        short = p.text if len(p.text) <= max_chars else p.text[:max_chars - 1] + "…"
        ax.plot(range(len(rel)), rel, marker="o", label=f"{p.label} ({p.probabilities[p.label]:.2f}): {short}")
        if p.increases:
            ups = [t for t in range(1, len(rel)) if rel[t] > rel[t - 1]]
            ax.plot(ups, [rel[t] for t in ups], "x", color="red", markersize=10)
    ax.set_xlabel("layer t")
    ax.set_ylabel("(E(Y_t) - E(Y_0)) / |E(Y_0)|")
    ax.set_title("energy per layer, per text")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    with atomic_open(path) as fh:
        fig.savefig(fh, format="png", dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("run_dir", type=folder_arg, metavar="RUN_DIR", help="a finished run folder or a saved bundle")
    p.add_argument("--text", action="append", default=[], help="a text to classify (repeatable)")
    p.add_argument("--file", action="append", default=[], help="a UTF-8 file of texts, one a line ('-': stdin, read by the same rule: "
                                                                 "bytes that are not UTF-8 are refused)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object a line (UTF-8, the text as it is); without it one line a text, five "
                        "tab-separated fields (label, probabilities, verdict, energies, text) where the label and "
                        "the text escape a backslash as \\\\, tab, newline and carriage return as \\t, \\n, \\r, "
                        "other control characters as \\xHH and U+2028/U+2029 as \\uHHHH")
    p.add_argument("--plot", metavar="OUT.png", help="draw each text's per-layer energy")
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--layers", type=positive_int, metavar="K",
                   help="unroll the shared step K times instead of the trained depth (weight-shared encoders: "
                        "guaranteed; refused for untied free/baseline stacks)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--legacy", action="store_true",
                   help="read a run folder from before bundles (no bundle.json): nothing ties its weights to its "
                        "config and vocabulary")
    args = p.parse_args(argv)

    def body() -> int:
        if args.plot is not None:
            check_plot_path(args.plot)          # before any work: nothing printed, nothing written on refusal
        texts = read_texts(args.text, args.file)
        trained = load_model(args.run_dir, map_location=check_device(args.device, "--device", ConfigError),
                             legacy=args.legacy)
        layers = check_inference_layers(trained.model.encoder, args.layers, "--layers")
        predictions = trained.predict(texts, batch_size=args.batch_size, layers=layers)
        if args.plot:
            plot_energies(predictions, args.plot)   # first: a failed write leaves no half-printed answer
        for pred in predictions:
            if args.json:
                print(json_line(pred.to_dict()))
            else:
                probs = " ".join(f"{k} {v:.3f}" for k, v in pred.probabilities.items())
                energy = " -> ".join(f"{e:.4g}" for e in pred.energies)
                print(f"{escape_field(pred.label)}\t[{probs}]\t{pred.verdict} ({pred.increases} increases)\tE: "
                      f"{energy}\t{escape_field(pred.text)}")
        return 0

    return run_main(PROG, body, argv)


if __name__ == "__main__":
    sys.exit(main())
