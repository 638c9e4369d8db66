"""Use a trained model on new text: ``unfold-predict RUN_DIR --text "..." [--file F] [--json]``.

For each text: the label name, the class probabilities, the energy E(Y_t) at every layer boundary (float64 by
default, ``train.check_dtype``) with the descent check (increases beyond the tolerance, non-finite steps,
verdict), and how many of its tokens the model does not know. ``--json`` prints one JSON object a line (keys
``text``, ``label``, ``label_id``, ``probabilities``, ``energies``, ``energy_terms``, ``increases``,
``nonfinite``, ``descent``, ``verdict``, ``tokens``, ``truncated``, ``unknown_tokens``, ``unknown_words``);
without it one line a text, six tab-separated fields (label, probabilities, verdict, energies, tokens, text). A
text none of whose tokens is in the vocabulary is predicted from the model's prior alone: it is warned about on
stderr (``warning:`` lines) and its ``unknown_tokens`` equals its ``tokens``. ``--layers K`` unrolls the shared
step K times instead of the trained depth (weight-shared encoders only: refused for untied free/baseline
stacks). The same as the Python call ``experiments.app.bundle.load_model(RUN_DIR).predict(texts)``.

**Fill-mask.** On a masked-token model (``task: masked_tokens``) each text needs a ``[MASK]`` (a text without one is
refused, exit 2) and the answer is, per ``[MASK]``, the ``--top-k`` most probable tokens with their probabilities,
as Hugging Face's fill-mask pipeline gives them, and the energy verdict: ``--json`` prints one object a text (keys
``text``, ``masks`` (a list per ``[MASK]`` of ``{score, token, token_str, sequence}``, best first), ``energies``,
``energy_terms``, ``increases``, ``nonfinite``, ``descent``, ``verdict``, ``tokens``, ``truncated``,
``unknown_tokens``, ``unknown_words``); the plain line has four fields (`fill_mask_line`). On a classifier
``[MASK]`` is text like any other.

**Streaming.** Texts are read line by line (``--text`` values first, then each ``--file``; ``-`` is stdin; with
neither, stdin when it is not a terminal: ``printf 'a fine film\\n' | unfold-predict RUN_DIR``) by a reader
thread into a queue of ``--batch-size`` texts, predicted a batch at a time, and each batch's lines are printed and
flushed as soon as it is done: memory is bounded by about three batches of texts whatever the length
of the input, and the first line comes out while the input is still being written (a batch is whatever has
arrived, up to ``--batch-size``, within `LINGER` seconds of its first text). Files and stdin are strict
UTF-8 alike; a file that is not is refused before anything is predicted (files are checked whole first), stdin
where the bad line is met (every line before it has been answered and flushed). A line holds at most
``MAX_LINE_BYTES`` (1 MiB) and is read at most that much at a time: a longer one is refused by its number.

**No answer from NaN.** A text whose class probabilities are not finite gets no line: it is named on stderr (an
``error:`` line, at once) and the command exits ``NONFINITE_EXIT`` (3) once the other texts' lines are printed.
Plug-ins' prints go to stderr (``unfold.plugins.plugin_output``): stdout holds the answer only.

``--plot OUT.png`` draws each text's total energy per layer, one panel per text on its own scale; it needs the
whole answer before the first line is printed (the figure is written first, so that a failed write never leaves
half an answer), so it keeps at most `PLOT_MAX` texts and refuses more (exit 2, nothing printed or
written): plot a selection. Exit status 0, or 2 for bad input (no such run, a run still training, no text, a
changed bundle, a ``--plot`` path that cannot be written) with nothing written and nothing printed on stdout
(``--plot``'s folder is checked, a real write probe, before the model is loaded), or 3 where some text's output was
not finite (above). A run folder still being
trained (its run lock held, `experiments.runfolder.runlock`) is named as such with its owner (pid, user, host,
start); one whose owner died before the run finished says so and how to resume it. ``--legacy`` reads a run
folder from before bundles (no ``bundle.json``; unverified: see `experiments.app.bundle`).
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import queue
import stat
import sys
import threading
import time
from typing import Iterable, Iterator, List, Optional, Sequence

from energies.errors import CheckpointError, ConfigError
from unfold.cli import folder_arg, folder_problem, positive_int, run_main
from unfold.devices import check_device
from unfold.inputs import check_batch_size, check_inference_layers
from unfold.plugins import add_import_arg, plugin_output
from unfold.strict_json import dumps as json_dumps

from ..data.stream import MAX_LINE_BYTES, bounded_lines, decoded_lines
from ..runfolder.atomic import atomic_open
from .bundle import BUNDLE, Prediction, load_model
from .fill_mask import FillMaskPrediction
from ..runfolder.runlock import RUN_FILES, RunFolderError, lock_owner

PROG = "unfold-predict"
#: the most texts ``--plot`` takes (one panel each; the predictions are held until the figure is written)
PLOT_MAX = 48
#: seconds a batch waits for more texts after its first (then it is predicted with what has come)
LINGER = 0.05
# MAX_LINE_BYTES (experiments.data.stream): the longest line (text) read, in bytes of UTF-8 without its line break:
# 1 MiB. Lines are read at most this much at a time (memory stays bounded whatever the input: ``/dev/zero``, a file
# with no line break); a longer line is refused naming its number -- the model reads only the first
# ``data.max_len`` tokens of a text anyway
#: the exit status when the model's output for some text was not finite (NaN or infinite probabilities): those
#: texts get no line (no label), each is named on stderr; the other texts' lines are printed
NONFINITE_EXIT = 3


def _decode(data: bytes, where: str) -> str:
    """``data`` as strict UTF-8 (the one reading rule of ``--file PATH`` and ``--file -``): invalid bytes are a
    [`ConfigError`][energies.ConfigError] naming ``where``, the byte offset and the line, never surrogate escapes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}, line {line})") from None


def _check_texts(texts: Sequence[str]) -> None:
    """``--text`` values: none empty, each valid Unicode (an argument of invalid UTF-8 bytes reaches Python as
    lone surrogates: refused as a file's invalid bytes are)."""
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise ConfigError(f"--text number {empty[0] + 1} is empty: there is nothing to classify")
    for i, t in enumerate(texts):
        try:
            size = len(t.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ConfigError(f"--text number {i + 1}: not UTF-8 text (a lone surrogate {t[exc.start]!a} at "
                              f"character {exc.start}: the argument's bytes are not UTF-8)") from None
        if size > MAX_LINE_BYTES:
            raise ConfigError(f"--text number {i + 1} is {size:,} bytes long, more than the {MAX_LINE_BYTES:,} "
                              "bytes (1 MiB) a text may hold")


def _where(path: str) -> str:
    return "--file - (stdin)" if path == "-" else f"--file {path}"


def _decoded_lines(raw_lines: Iterable[bytes], where: str) -> Iterator[str]:
    """The texts of ``raw_lines`` (byte lines, each ending with ``\\n`` but maybe the last) one by one: each decoded
    as strict UTF-8 (`_decode`'s rule and message: byte offset and line counted over the whole input),
    split at every line break ``str.splitlines`` knows, blank ones skipped -- the texts ``_decode(all).splitlines()``
    gives, without holding more than one line (`experiments.data.stream.decoded_lines`, refusing with a
    ConfigError)."""
    return decoded_lines(raw_lines, where, ConfigError)


def _bounded_lines(read_line, where: str) -> Iterator[bytes]:
    """The byte lines of a stream (``read_line(size)``: a ``readline`` that returns at most ``size`` bytes), each
    read in at most `MAX_LINE_BYTES` + 1 bytes: memory stays bounded whatever the input. A line longer than
    `MAX_LINE_BYTES` (its line break not counted) is a ConfigError naming ``where`` and the line's number
    (`experiments.data.stream.bounded_lines`, the rule unlabelled text files are read by too)."""
    return bounded_lines(read_line, where, MAX_LINE_BYTES, ConfigError)


def _stdin_line(size: int) -> bytes:
    """One line of stdin as bytes, at most ``size`` of them (characters where stdin has no byte buffer)."""
    stream = getattr(sys.stdin, "buffer", None)
    if stream is not None:
        return stream.readline(size)
    return sys.stdin.readline(size).encode("utf-8", "surrogateescape")


def _file_texts(path: str) -> Iterator[str]:
    """The texts of one ``--file`` (``-``: stdin), read line by line, each line bounded (`_bounded_lines`,
    `_decoded_lines`)."""
    if path == "-":
        yield from _decoded_lines(_bounded_lines(_stdin_line, _where(path)), _where(path))
        return
    with open(path, "rb") as fh:
        yield from _decoded_lines(_bounded_lines(fh.readline, _where(path)), _where(path))


def iter_texts(texts: Sequence[str], files: Sequence[str]) -> Iterator[str]:
    """``--text`` values, then the lines of each ``--file`` (``-`` is stdin; blank lines skipped), lazily. Checked
    before the first text is given (so that a refusal comes before any work): the ``--text`` values
    (`_check_texts`), and every ``--file`` that is a regular file, read through once as strict UTF-8 (it
    can be read twice; stdin, a pipe or a device cannot, and are checked as they are read)."""
    _check_texts(texts)
    for path in files:
        if path != "-" and stat.S_ISREG(os.stat(path).st_mode):
            for _ in _file_texts(path):
                pass
    return _chain(list(texts), list(files))


def _chain(texts: List[str], files: List[str]) -> Iterator[str]:
    yield from texts
    for path in files:
        yield from _file_texts(path)


def read_texts(texts: Sequence[str], files: Sequence[str]) -> List[str]:
    """`iter_texts` as a list (all of them in memory), refused when there is no text."""
    out = list(iter_texts(texts, files))
    if not out:
        raise ConfigError(NO_TEXT)
    return out


NO_TEXT = ("no text to classify: give --text TEXT or --file FILE (one text a line), or pipe the texts in "
           "(printf 'a fine film\\n' | unfold-predict RUN_DIR)")


def _stdin_piped() -> bool:
    """Whether stdin can be read and is not a terminal (a pipe, a file, ``/dev/null``): then a command line with
    no ``--text`` and no ``--file`` reads its texts from stdin, as ``--file -`` does."""
    stream = sys.stdin
    try:
        return stream is not None and stream.readable() and not stream.isatty()
    except (OSError, ValueError):            # closed or detached
        return False


def text_sources(texts: Sequence[str], files: Sequence[str]) -> List[str]:
    """The ``--file`` list a command line means: ``files`` as given, or ``["-"]`` (stdin) when neither ``--text``
    nor ``--file`` is given and stdin is piped (`_stdin_piped`); with neither and stdin a terminal, a ConfigError
    (`NO_TEXT`) that names ``--text``, ``--file`` and piping, before any model is loaded."""
    if texts or files:
        return list(files)
    if _stdin_piped():
        return ["-"]
    raise ConfigError(NO_TEXT)


class TextFeed:
    """Texts from an iterator, read ahead by a daemon thread into a queue of at most ``size`` (the memory bound),
    handed out by `get`; an error of the reader (invalid UTF-8 on stdin) is raised by the `get` that
    reaches it, after the texts before it."""

    END = object()

    def __init__(self, source: Iterator[str], size: int):
        self._queue: "queue.Queue" = queue.Queue(maxsize=max(1, size))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(source,), name="unfold-predict-reader", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Iterator[str]) -> None:
        try:
            for text in source:
                if not self._put((True, text)):
                    return
        except BaseException as exc:  # noqa: BLE001 -- handed to the reading thread, raised there
            self._put((False, exc))
            return
        self._put((True, self.END))

    def get(self, timeout: Optional[float] = None):
        """The next text, or `END`; ``queue.Empty`` when none comes within ``timeout`` seconds."""
        ok, item = self._queue.get(timeout=timeout)
        if not ok:
            self._put((False, item))      # every later get raises it too
            raise item
        if item is self.END:
            self._put((True, self.END))
        return item

    def batches(self, first: str, batch_size: int, linger: float = LINGER) -> Iterator[List[str]]:
        """Batches of the texts, ``first`` leading: each up to ``batch_size`` texts, closed early when no text
        comes within ``linger`` seconds of its first one (so that a line typed alone is answered at once). An error
        of the reader (a bad line) ends the batch it is met in: that batch is yielded first, the error raised
        after, so that every text before the bad line is answered."""
        pending: Optional[str] = first
        while True:
            if pending is None:
                pending = self.get()
                if pending is self.END:
                    return
            batch, pending = [pending], None
            deadline = time.monotonic() + linger
            while len(batch) < batch_size:
                try:
                    item = self.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                except Exception as exc:    # the reader's error (a bad line): the texts before it answered first
                    yield batch
                    raise exc
                if item is self.END:
                    yield batch
                    return
                batch.append(item)
            yield batch

    def close(self) -> None:
        self._stop.set()


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
    """Refuse ([`ConfigError`][energies.ConfigError] naming ``--plot`` and the path) a figure path that cannot be written: not
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


def tokens_field(pred: Prediction) -> str:
    """The plain output's tokens field: ``N tokens, K unknown (w1 w2 ...)``; ``all unknown ...: prior only`` when
    the model knows none of them (its prediction is the model's prior); ``, truncated`` when the text was longer
    than the model reads."""
    words = f" ({' '.join(pred.unknown_words)})" if pred.unknown_words else ""
    count = f"{pred.tokens} token{'' if pred.tokens == 1 else 's'}"
    if pred.prior_only:
        text = f"{count}, all unknown{words}: prior only"
    else:
        text = f"{count}, {pred.unknown_tokens} unknown{words}"
    return text + (", truncated" if pred.truncated else "")


def plain_line(pred: Prediction) -> str:
    """One text's line of the plain output: six tab-separated fields (``--json``'s help); a fill-mask answer's:
    four (`fill_mask_line`)."""
    if isinstance(pred, FillMaskPrediction):
        return fill_mask_line(pred)
    probs = " ".join(f"{k} {v:.3f}" for k, v in pred.probabilities.items())
    energy = " -> ".join(f"{e:.4g}" for e in pred.energies)
    return (f"{escape_field(pred.label)}\t[{probs}]\t{pred.verdict} ({pred.increases} increases)\tE: {energy}\t"
            f"{escape_field(tokens_field(pred))}\t{escape_field(pred.text)}")


def fill_mask_line(pred: FillMaskPrediction) -> str:
    """One text's line of the plain output of a masked-token model, four tab-separated fields: the candidates of
    each ``[MASK]`` (``token score`` pairs, best first; the masks separated by `` | ``), the verdict, the
    energies, the text."""
    masks = " | ".join(" ".join(f"{escape_field(c.token_str)} {c.score:.3f}" for c in cands) for cands in pred.masks)
    energy = " -> ".join(f"{e:.4g}" for e in pred.energies)
    return f"[{masks}]\t{pred.verdict} ({pred.increases} increases)\tE: {energy}\t{escape_field(pred.text)}"


def _short(text: str, max_chars: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= max_chars else text[:max_chars - 1] + "…"


def energy_figure(predictions: Sequence[Prediction], max_chars: int = 34):
    """The ``--plot`` figure: one panel per text, each on its own y scale (a text whose energies are small or near
    0 changes no other panel), showing the total energy E(Y_t) -- the quantity each layer must not raise --
    against the layer t, a rise marked with a red cross, the panel's title giving the text, its label and
    probability, the verdict, and ``prior only`` for a text with no known token. Returns the matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(predictions)
    cols = max(1, n) if n <= 4 else 3 if n <= 6 else 4 if n <= 16 else 6
    rows = max(1, -(-n // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.5 * rows + 0.9), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.set_visible(False)
            continue
        p = predictions[i]
        e = p.energies
        rises = [t for t in range(1, len(e)) if e[t] > e[t - 1]]
        colour = "tab:blue" if p.descent else "tab:red"
        ax.plot(range(len(e)), e, marker="o", markersize=3.5, color=colour, linewidth=1.6)
        if rises:
            ax.plot(rises, [e[t] for t in rises], "x", color="red", markersize=9, markeredgewidth=2)
        ax.ticklabel_format(axis="y", useOffset=False, style="sci", scilimits=(-3, 4))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        prob = p.probabilities.get(p.label, float("nan"))
        flags = ", no word known: prior only" if p.prior_only else ""
        rose = f" ({p.increases} rise{'s' if p.increases > 1 else ''})" if p.increases else ""
        ax.set_title(f"{i + 1}. \"{_short(p.text, max_chars)}\"\n{p.label} {prob:.2f} · {p.verdict}"
                     f"{rose}{flags}", fontsize=7.5,
                     color="black" if p.descent else "tab:red")
        fall = e[0] - e[-1] if e else float("nan")
        ax.text(0.98, 0.95, f"E0 = {e[0]:.4g}\nE{len(e) - 1} = {e[-1]:.4g}\nfell {fall:.3g}", transform=ax.transAxes,
                ha="right", va="top", fontsize=6.5, color="0.25")
        if i % cols == 0:
            ax.set_ylabel("total energy E(Y_t)", fontsize=7.5)
        if i >= n - cols:
            ax.set_xlabel("layer t", fontsize=7.5)
    fig.suptitle("Total energy per layer, one panel per text, each on its own scale.\n"
                 "Each layer must lower it or leave it (descent); a red x marks a rise, a red title a text that rose.",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def plot_energies(predictions: Sequence[Prediction], path: str) -> None:
    """`energy_figure` written to ``path`` (PNG, atomically)."""
    import matplotlib.pyplot as plt

    fig = energy_figure(predictions)
    with atomic_open(path) as fh:
        fig.savefig(fh, format="png", dpi=120)
    plt.close(fig)


def _check_run(run_dir: str) -> None:
    """Refuse a run folder still being trained (its run lock held, no bundle yet), naming the run's owner."""
    owner = lock_owner(run_dir)
    if owner is not None and owner.held and not os.path.lexists(os.path.join(run_dir, BUNDLE)):
        raise RunFolderError(f"{run_dir} is a run still in progress: it is being trained by {owner.describe()}, and "
                             "has no model to predict with until it finishes (its bundle is written at the end); "
                             "wait for it, or predict with another run")


def _stale(run_dir: str, exc: CheckpointError) -> Optional[RunFolderError]:
    """Where ``load_model`` refused a run folder that holds a run's checkpoints but no bundle, and whose run lock
    is free although an owner is recorded: the run was stopped before it finished (its process ended or died);
    the error that says so, naming that owner and how to resume, or None."""
    owner = lock_owner(run_dir)
    if owner is None or owner.held or not owner.pid or os.path.lexists(os.path.join(run_dir, BUNDLE)):
        return None
    if not any(os.path.lexists(os.path.join(run_dir, n)) for n in RUN_FILES):
        return None
    return RunFolderError(f"{run_dir} holds a run that did not finish: its owner ({owner.describe()}) no longer "
                          f"runs it (the process ended or died before the run wrote its bundle). Resume it with "
                          f"unfold-train --resume {run_dir}, which "
                          f"finishes the run and writes the bundle. ({exc})")


def main(argv=None) -> int:
    """``unfold-predict``: the module docstring's command; exit 0, or 2 with one ``error:`` line."""
    args = _parser().parse_args(argv)

    def body() -> int:
        if args.plot is not None:
            check_plot_path(args.plot)          # before any work: nothing printed, nothing written on refusal
        check_batch_size(args.batch_size, "--batch-size")
        feed = TextFeed(iter_texts(args.text, text_sources(args.text, args.file)), args.batch_size)
        out = sys.stdout                        # the answer's stream; plug-ins' prints go to stderr meanwhile
        try:
            with plugin_output():
                return _predict(args, feed, out)
        finally:
            feed.close()

    with _warnings_to_stderr():
        return run_main(PROG, body, argv)


def _predict(args: argparse.Namespace, feed: TextFeed, out) -> int:
    """The command's work once its options are checked: the texts of ``feed`` predicted and written to ``out``
    (`_print`), or first drawn (``--plot``); returns the exit status."""
    first = feed.get()
    if first is feed.END:
        raise ConfigError(NO_TEXT)
    plotted: Optional[List[str]] = None
    if args.plot:                       # the figure needs every text: at most PLOT_MAX, held
        plotted = _plot_texts(feed, first)
    _check_run(args.run_dir)
    trained = _load(args)
    layers = check_inference_layers(trained.model.encoder, args.layers, "--layers")
    if plotted is not None and trained.task != "classify":
        raise ConfigError(f"--plot draws a classifier's predictions; {args.run_dir} is a {trained.task} model "
                          "(fill-mask): leave --plot out")
    if plotted is not None:
        batches: Iterable[List[str]] = (plotted[s:s + args.batch_size]
                                        for s in range(0, len(plotted), args.batch_size))
        predictions = [q for b in trained.predict_batches(batches, layers=layers) for q in b]
        drawn = [q for q in predictions if finite(q)]
        if drawn:
            plot_energies(drawn, args.plot)     # first: a failed write leaves no half-printed answer
        return _print([predictions], args.json, out)
    return _print(trained.predict_batches(feed.batches(first, args.batch_size), layers=layers, top_k=args.top_k),
                  args.json, out)


def finite(pred: Prediction) -> bool:
    """Whether the model's output for a text is finite: every class probability a finite number (a NaN or infinite
    logit makes them NaN; fill-mask: every candidate's score). A text whose output is not gets no label:
    `unfold-predict` names it on stderr."""
    if isinstance(pred, FillMaskPrediction):
        return pred.finite
    return all(math.isfinite(p) for p in pred.probabilities.values())


def nonfinite_message(number: int, pred: Prediction) -> str:
    """The stderr line's message for text ``number`` (from 1) whose output is not finite."""
    text = " ".join(pred.text.split())
    shown = text if len(text) <= 60 else text[:59] + "…"
    probs = ", ".join(f"{k} {v}" for k, v in pred.probabilities.items()) if not isinstance(pred, FillMaskPrediction) \
        else ", ".join(f"{c.token_str} {c.score}" for cands in pred.masks for c in cands)
    return (f"text {number} {shown!r}: the model's output is not finite (probabilities: {probs}; its weights or "
            "this input overflow the model's arithmetic): no label")


def _parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("run_dir", type=folder_arg, metavar="RUN_DIR", help="a finished run folder or a saved bundle")
    p.add_argument("--text", action="append", default=[], help="a text to classify (repeatable)")
    p.add_argument("--file", action="append", default=[], help="a UTF-8 file of texts, one a line ('-': stdin, read by the same rule: "
                                                                 "bytes that are not UTF-8 are refused); read and "
                                                                 "answered as it comes, a batch at a time. With "
                                                                 "neither --text nor --file, texts piped in on "
                                                                 "stdin are read as --file -")
    p.add_argument("--json", action="store_true",
                   help="one JSON object a line (UTF-8, the text as it is); without it one line a text, six "
                        "tab-separated fields (label, probabilities, verdict, energies, tokens, text) where the "
                        "tokens field counts the text's tokens and the unknown ones ('prior only' when the model "
                        "knows none), and the label and the text escape a backslash as \\\\, tab, newline and "
                        "carriage return as \\t, \\n, \\r, other control characters as \\xHH and U+2028/U+2029 "
                        "as \\uHHHH")
    p.add_argument("--plot", metavar="OUT.png", help=f"draw each text's total energy per layer, one panel per text "
                                                    f"on its own scale (at most {PLOT_MAX} texts)")
    p.add_argument("--top-k", type=positive_int, default=5, metavar="K",
                   help="a masked-token model (task masked_tokens): the K most probable tokens at each [MASK] "
                        "(default 5)")
    p.add_argument("--batch-size", type=positive_int, default=64,
                   help="texts predicted together (default 64); memory is bounded by about three batches")
    p.add_argument("--layers", type=positive_int, metavar="K",
                   help="unroll the shared step K times instead of the trained depth (weight-shared encoders: "
                        "guaranteed; refused for untied free/baseline stacks)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--legacy", action="store_true",
                   help="read a run folder from before bundles (no bundle.json): nothing ties its weights to its "
                        "config and vocabulary")
    return p


def _plot_texts(feed: TextFeed, first: str) -> List[str]:
    """Every text of the input for ``--plot`` (held: the figure needs them all), refused past `PLOT_MAX`."""
    plotted = [first]
    while len(plotted) <= PLOT_MAX:
        item = feed.get()
        if item is feed.END:
            break
        plotted.append(item)
    if len(plotted) > PLOT_MAX:
        raise ConfigError(f"--plot draws one panel per text and takes at most {PLOT_MAX} texts; this "
                          f"input has more: plot a selection (head -n {PLOT_MAX} FILE | unfold-predict RUN_DIR "
                          "--file - --plot OUT.png) and predict the rest without --plot")
    return plotted


def _load(args: argparse.Namespace):
    """The model of ``args.run_dir`` (`load_model`); a run stopped before it finished named as such."""
    try:
        return load_model(args.run_dir, map_location=check_device(args.device, "--device", ConfigError),
                          legacy=args.legacy)
    except CheckpointError as exc:
        stale = _stale(args.run_dir, exc)
        if stale is not None:
            raise stale from None
        raise


def _print(batches: Iterable[List[Prediction]], as_json: bool, out=None) -> int:
    """Each batch's lines written to ``out`` (default stdout) and flushed as soon as it is done. A text whose
    output is not finite (`finite`) gets no line: it is named on stderr (``error:`` line, at once) and the
    exit status is `NONFINITE_EXIT` once every text is done. A reader that stops reading (``| head``) ends the run
    quietly (exit 0). An error after some lines were printed says how many were."""
    printed = seen = failed = 0
    out = sys.stdout if out is None else out
    try:
        for batch in batches:
            good = []
            for q in batch:
                seen += 1
                if finite(q):
                    good.append(q)
                    continue
                failed += 1
                sys.stderr.write(f"{PROG}: error: {nonfinite_message(seen, q)}\n")
                sys.stderr.flush()
            out.write("".join((json_line(q.to_dict()) if as_json else plain_line(q)) + "\n" for q in good))
            out.flush()
            printed += len(good)
    except BrokenPipeError:
        try:                                   # nothing more can be written: the interpreter's last flush neither
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 0
    except ConfigError as exc:
        if seen:
            raise ConfigError(f"{exc} (the {seen} text(s) before it were answered above)") from None
        raise
    return NONFINITE_EXIT if failed else 0


class _warnings_to_stderr:
    """The ``experiments.app.predict`` logger (the no-known-token warnings) to stderr as ``PROG: warning: ...`` lines
    for the duration of a command."""

    def __enter__(self):
        self.log = logging.getLogger("experiments.app.predict")
        self.handler = logging.StreamHandler(sys.stderr)
        self.handler.setFormatter(logging.Formatter(f"{PROG}: warning: %(message)s"))
        self.propagate = self.log.propagate
        self.log.addHandler(self.handler)
        self.log.propagate = False
        return self

    def __exit__(self, *exc):
        self.log.removeHandler(self.handler)
        self.log.propagate = self.propagate


if __name__ == "__main__":
    sys.exit(main())
