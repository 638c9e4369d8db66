"""``unfold-predict`` as a stream: lines answered a batch at a time as they come (the first while the
input is still open), memory bounded by the batch size whatever the input's length, unknown tokens counted per
text and a text with no known token flagged and warned about, a run still training named with its owner (and a
run whose owner died told how to resume), and the ``--plot`` figure one panel per text on its own scale."""
import io
import json
import os
import select
import subprocess
import sys
import textwrap

import pytest
import torch

from clifuzz import run_cli
from test_train import ROOT

PREDICT = "experiments.app.predict"
VOCAB = ["<pad>", "<unk>", "good", "bad", "film", "great", "dull"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A tiny untrained model (d=8, 2 layers, max_len 16) saved as a bundle: predicting needs no training."""
    from experiments.app.build import build_model
    from experiments.app.bundle import TrainedModel, save_model
    from experiments.app.config import load_config
    from experiments.data.text import Vocab

    cfg = load_config("tiny", ["model.d=8", "model.heads=2", "model.layers=2", "data.max_len=16", "data.glove=none"])
    torch.manual_seed(0)
    vocab = Vocab(VOCAB)
    folder = str(tmp_path_factory.mktemp("predict_stream") / "bundle")
    save_model(TrainedModel(build_model(cfg, len(vocab), 2), cfg, vocab, ["neg", "pos"]), folder)
    return folder


def _env():
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _readline(stream, timeout: float) -> bytes:
    """One line of ``stream`` (an unbuffered pipe: nothing read ahead that select cannot see), or b"" when none
    has begun within ``timeout`` seconds."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else b""


# ------------------------------------------------------------------ streaming: the first line before the input ends

def test_the_first_line_is_answered_while_the_input_is_still_open(bundle, tmp_path):
    """Two lines written to stdin, the pipe left open: their answers come out (flushed) while the command still
    waits for more, then the rest once more lines come and stdin closes; no prediction is held until stdin
    closes (the first read would time out)."""
    proc = subprocess.Popen([sys.executable, "-m", PREDICT, bundle, "--file", "-", "--json"], cwd=str(tmp_path),
                            env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    try:
        proc.stdin.write(b"good film\nqqq zzz\n")
        proc.stdin.flush()
        first = _readline(proc.stdout, 120)
        second = _readline(proc.stdout, 30)
        assert proc.poll() is None                                       # still running: stdin is open
        assert first and second, proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "no line"
        assert [json.loads(first)["text"], json.loads(second)["text"]] == ["good film", "qqq zzz"]
        proc.stdin.write(b"great\n\nbad dull film\n")
        proc.stdin.close()
        rest = proc.stdout.read().decode().splitlines()
        err = proc.stderr.read().decode()
        assert proc.wait(60) == 0, err[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [json.loads(x)["text"] for x in rest] == ["great", "bad dull film"]           # blank line skipped
    # the text none of whose tokens the model knows is warned about on stderr, the others are not
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "text 2 'qqq zzz'" in warnings[0] and "prior" in warnings[0], err


# ------------------------------------------------------------------ stdin without --file: piped texts are read

def _predict_proc(bundle, cwd, argv, stdin):
    return subprocess.run([sys.executable, "-m", PREDICT, bundle, *argv], stdin=stdin, capture_output=True,
                          cwd=cwd, env=_env(), timeout=300)


def test_texts_piped_in_without_text_or_file_are_read_as_file_dash(bundle, tmp_path):
    """``printf ... | unfold-predict RUN`` (no --text, no --file) answers every piped line as ``--file -`` does,
    through the same bounded line reader: a line past MAX_LINE_BYTES is refused by its number as stdin's, after
    the lines before it were answered (never "no text to classify", exit 2)."""
    from experiments.data.stream import MAX_LINE_BYTES

    data = tmp_path / "in.txt"
    data.write_bytes(b"a fine film\n\ngood great\nbad dull film\n")
    with open(data, "rb") as fh:
        piped = _predict_proc(bundle, str(tmp_path), ["--json"], fh)
    with open(data, "rb") as fh:
        dash = _predict_proc(bundle, str(tmp_path), ["--json", "--file", "-"], fh)
    assert piped.returncode == 0, piped.stderr.decode()[-2000:]
    assert [json.loads(x)["text"] for x in piped.stdout.splitlines()] == ["a fine film", "good great", "bad dull film"]
    assert piped.stdout == dash.stdout
    data.write_bytes(b"good\n" + b"x" * (MAX_LINE_BYTES + 1) + b"\nbad\n")
    with open(data, "rb") as fh:
        long = _predict_proc(bundle, str(tmp_path), ["--json", "--batch-size", "1"], fh)
    err = long.stderr.decode()
    assert long.returncode == 2 and "--file - (stdin)" in err and "line 2" in err, err[-2000:]
    assert [json.loads(x)["text"] for x in long.stdout.splitlines()] == ["good"]


def test_no_text_on_a_terminal_names_text_file_and_piping(bundle, tmp_path):
    """With no --text or --file and stdin a terminal (a pseudo-terminal here) the command does not wait for
    typing: it exits 2, prints nothing on stdout, and its error names --text, --file and piping."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = _predict_proc(bundle, str(tmp_path), [], follower)
    finally:
        os.close(follower)
        os.close(leader)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and proc.stdout == b"", err[-2000:]
    assert "--text" in err and "--file" in err and "| unfold-predict" in err and "pipe" in err, err


# ------------------------------------------------------------------ memory bounded by the batch, not the input

#: the child: predict.main under a peak-RSS probe, VmHWM of /proc/self/status (KiB): the peak of this program's
#: own memory; not ru_maxrss, which Linux carries over exec from the parent (the test, holding the input) when
#: the child is spawned by vfork
_PROBE = textwrap.dedent("""
    import sys
    from experiments.app import predict
    code = predict.main(sys.argv[1:])
    peak = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
    sys.stderr.write(f"PEAK_RSS_KIB {peak}\\n")
    sys.exit(code)
""")
LINE_BYTES, BATCH = 8192, 16


def _peak_rss_mib(bundle, cwd, lines: int) -> float:
    words = ("good film " * (LINE_BYTES // 10))[:LINE_BYTES - 1]       # 8 KiB a line (the model reads 16 tokens)
    data = "".join(f"{i} {words}\n" for i in range(lines)).encode()
    proc = subprocess.run([sys.executable, "-c", _PROBE, bundle, "--file", "-", "--batch-size", str(BATCH)],
                          input=data, capture_output=True, cwd=cwd, env=_env(), timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err[-2000:]
    assert proc.stdout.count(b"\n") == lines
    return int(err.rsplit("PEAK_RSS_KIB ", 1)[1].split()[0]) / 1024


def test_peak_memory_does_not_grow_with_the_input(bundle, tmp_path):
    """2,000 lines of 8 KiB (16 MB of input) against 20: the peak RSS grows by less than 12 MiB. The design's
    bound: the reader holds at most a queue of ``--batch-size`` texts, the batch being predicted and one more,
    each as its bytes and its str (3 x 16 x 8 KiB x 2 = 0.75 MiB), plus the token list of one text; the 12 MiB
    leave room for the allocator. A reader that held the whole input three times over (bytes, decoded str, the
    list of lines) and every prediction until the end measures +27.5 MiB here, and +180 MiB on 100,000 short
    lines."""
    small = _peak_rss_mib(bundle, str(tmp_path), 20)
    large = _peak_rss_mib(bundle, str(tmp_path), 2000)
    assert large - small < 12, (small, large)


# ------------------------------------------------------------------ line reading: the same texts and refusals as before

@pytest.mark.parametrize("data", [b"a\nb\r\nc\rd\x0ce\xc2\x85f\xe2\x80\xa8g\n\n  \nh", b"", b"\n\n", b"x", b"caf\xc3\xa9\r\n",
                                  b"ok\n\xff\xfe bad\nw1\n", b"a\nb\n\xe2\x82", b"a\xe2\x82\nb\n"])
def test_reading_line_by_line_gives_the_texts_and_refusals_of_reading_it_whole(data):
    """The streaming reader yields the texts ``_decode(data).splitlines()`` gave (every line break Python knows,
    blank lines skipped), and refuses invalid UTF-8 with the same message (byte offset and line of the input)."""
    from energies.errors import ConfigError
    from experiments.app.predict import _decode, _decoded_lines

    try:
        whole = [t for t in _decode(data, "W").splitlines() if t.strip()]
    except ConfigError as exc:
        with pytest.raises(ConfigError) as got:
            list(_decoded_lines(io.BytesIO(data), "W"))
        assert str(got.value) == str(exc)
    else:
        assert list(_decoded_lines(io.BytesIO(data), "W")) == whole


# ------------------------------------------------------------------ unknown tokens: counted, flagged, warned

def test_unknown_tokens_are_counted_and_a_text_with_none_known_is_flagged(bundle, tmp_path, caplog):
    """``unknown_tokens`` / ``unknown_words`` per text (JSON and the plain output's tokens field), ``prior_only``
    and a warning when no token is known."""
    from experiments.app.bundle import load_model

    model = load_model(bundle)
    with caplog.at_level("WARNING", logger="experiments.app.predict"):
        known, mixed, unknown = model.predict(["good film", "good qqq film zzz qqq", "qqq zzz"])
    assert (known.tokens, known.unknown_tokens, known.unknown_words, known.prior_only) == (2, 0, [], False)
    assert (mixed.tokens, mixed.unknown_tokens, mixed.unknown_words, mixed.prior_only) == (5, 3, ["qqq", "zzz"], False)
    assert (unknown.tokens, unknown.unknown_tokens, unknown.prior_only) == (2, 2, True)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "text 3 'qqq zzz'" in warned[0] and "prior" in warned[0]
    code, out, err = run_cli(PREDICT, [bundle, "--text", "good qqq", "--text", "qqq zzz", "--json"], str(tmp_path))
    assert code == 0, err
    rows = [json.loads(x) for x in out.splitlines()]
    assert [(r["tokens"], r["unknown_tokens"], r["unknown_words"]) for r in rows] == [(2, 1, ["qqq"]),
                                                                                    (2, 2, ["qqq", "zzz"])]
    assert err.count("warning:") == 1 and "text 2" in err
    code, out, err = run_cli(PREDICT, [bundle, "--text", "good qqq", "--text", "qqq zzz"], str(tmp_path))
    fields = [line.split("\t") for line in out.splitlines()]
    assert code == 0 and [len(f) for f in fields] == [6, 6]
    assert fields[0][4] == "2 tokens, 1 unknown (qqq)" and fields[1][4] == "2 tokens, all unknown (qqq zzz): prior only"


# ------------------------------------------------------------------ a run in progress, a run whose owner died

_HOLDER = textwrap.dedent("""
    import sys, time
    from experiments.runfolder.runlock import RunLock
    RunLock(sys.argv[1]).acquire()
    print("held", flush=True)
    time.sleep(300)
""")


def test_a_run_in_progress_is_named_with_its_owner_and_a_dead_owner_is_told_how_to_resume(tmp_path):
    """A process holds the run folder's lock (a run training, its first checkpoint written, no bundle yet):
    predict says the run is in progress and names the owner (pid, user, host, start). Once that process is
    killed (the lock is free, its owner still recorded), predict says the run did not finish and how to resume
    it; the run in progress is never told to "finish it with --resume", neither is told the folder is not a
    bundle."""
    import socket

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("data: {}\n")
    (run / "last.pt").write_bytes(b"not a real checkpoint")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run)], env=_env(), stdout=subprocess.PIPE,
                              cwd=str(tmp_path), bufsize=0)
    try:
        assert _readline(holder.stdout, 120) == b"held\n"
        code, out, err = run_cli(PREDICT, [str(run), "--text", "good film"], str(tmp_path))
        assert code == 2 and out == "" and "still in progress" in err, err
        assert f"pid {holder.pid}" in err and socket.gethostname() in err and " since 20" in err, err
        assert "--resume" not in err
    finally:
        holder.kill()
        holder.wait()
    code, out, err = run_cli(PREDICT, [str(run), "--text", "good film"], str(tmp_path))
    assert code == 2 and out == "" and "did not finish" in err and f"pid {holder.pid}" in err, err
    assert f"--resume {run}" in err


# ------------------------------------------------------------------ --plot: one panel per text, each on its own scale

def _prediction(text, energies):
    from experiments.app.bundle import Prediction

    return Prediction(text=text, label="pos", label_id=1, probabilities={"neg": 0.3, "pos": 0.7}, energies=energies,
                      energy_terms={}, increases=0, nonfinite=0, descent=True, verdict="descent", tokens=2,
                      truncated=False)


def test_the_plot_draws_each_text_on_its_own_scale():
    """A text whose E(Y_0) is near 0 (which reads -4,300 % and flattens the others when every curve is divided by
    |E(Y_0)| on one axis) changes no other text's panel: each panel's y range is its own text's, and
    its curve fills it; the total energy is what the panels and the title name."""
    import matplotlib.pyplot as plt

    from experiments.app.predict import energy_figure

    a = _prediction("good film", [10.0, 9.7, 9.6])
    near_zero = _prediction("dull film fun", [1e-3, -90.0, -300.0])
    alone, both = energy_figure([a]), energy_figure([a, near_zero])
    try:
        panel, same, other = alone.axes[0], both.axes[0], both.axes[1]
        assert panel.get_ylim() == same.get_ylim()
        lo, hi = same.get_ylim()
        assert (10.0 - 9.6) / (hi - lo) > 0.7                       # the curve fills its panel
        assert other.get_ylim()[0] < -300 < 1e-3 < other.get_ylim()[1]
        assert "total energy" in same.get_ylabel() and "own scale" in both._suptitle.get_text()
    finally:
        plt.close(alone)
        plt.close(both)


def test_plot_takes_at_most_plot_max_texts_and_refuses_more_before_any_work(bundle, tmp_path):
    """``--plot`` holds every prediction until the figure is written: more than PLOT_MAX texts are refused (exit
    2, nothing printed, no figure); fewer are drawn."""
    from experiments.app.predict import PLOT_MAX

    many = tmp_path / "many.txt"
    many.write_text("good film\n" * (PLOT_MAX + 1))
    code, out, err = run_cli(PREDICT, [bundle, "--file", str(many), "--plot", "e.png"], str(tmp_path))
    assert code == 2 and out == "" and f"at most {PLOT_MAX}" in err and not (tmp_path / "e.png").exists(), err
    many.write_text("good film\n" * 3)
    code, out, err = run_cli(PREDICT, [bundle, "--file", str(many), "--plot", "e.png"], str(tmp_path))
    assert code == 0 and out.count("\n") == 3 and (tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG", err
