"""The energy-descent figure reads without the README: the total first, titled as the quantity
that must fall; every term marked as a part that may rise; a term unchanged at every layer left out and named,
with its value, in the caption that says how to read the figure."""
import torch

from experiments.app import plot_energy
from experiments.app.plot_energy import energy_caption, plot_energy_descent


def _draw(energies, monkeypatch, tmp_path):
    """The figure plot_energy_descent draws (captured before it is closed) and the file it wrote."""
    seen = {}
    real = plot_energy.save_figure

    def keep(fig, path, *args, **kwargs):
        seen["titles"] = [ax.get_title() for ax in fig.axes if ax.get_visible()]
        seen["texts"] = [t.get_text() for t in fig.texts]
        return real(fig, path, *args, **kwargs)

    monkeypatch.setattr(plot_energy, "save_figure", keep)
    path = plot_energy_descent(energies, str(tmp_path / "e.png"), "t")
    assert (tmp_path / "e.png").stat().st_size > 0
    return seen, path


def _energies(N=5, T=4):
    g = torch.Generator().manual_seed(0)
    steps = torch.arange(T + 1, dtype=torch.float64)
    return {"head0": -steps * 3 - torch.rand(N, 1, generator=g, dtype=torch.float64),
            "residual": steps + torch.rand(N, 1, generator=g, dtype=torch.float64),   # rises: a part, not the total
            "relu": torch.zeros(N, T + 1, dtype=torch.float64)}


def test_total_first_terms_marked_constant_named(monkeypatch, tmp_path):
    seen, _ = _draw(_energies(), monkeypatch, tmp_path)
    titles = seen["titles"]
    assert titles[0].startswith("TOTAL energy: must fall at every layer")
    assert [t.splitlines()[0] for t in titles[1:]] == ["term: head0", "term: residual"]   # relu not drawn
    assert all("may rise" in t for t in titles[1:])
    caption = " ".join(" ".join(seen["texts"]).split())
    assert "the TOTAL (first panel) must fall at every layer" in caption
    assert "unchanged at every layer: relu = 0." in caption


def test_a_term_that_moves_once_is_drawn(monkeypatch, tmp_path):
    """Negative control of the leaving-out rule: one example's relu value one ulp off at one layer is a term that
    changed, so it is drawn and not named as unchanged (the rule is exact equality, nothing hidden)."""
    e = _energies()
    e["relu"][2, 3] = torch.finfo(torch.float64).tiny
    seen, _ = _draw(e, monkeypatch, tmp_path)
    assert [t.splitlines()[0] for t in seen["titles"][1:]] == ["term: head0", "term: residual", "term: relu"]
    assert "unchanged" not in " ".join(seen["texts"])


def test_caption_names_each_constant_term_with_its_value():
    import numpy as np

    c = energy_caption({"relu": np.zeros((3, 4)), "bias": np.array([[1.5] * 4, [2.0] * 4])})
    assert "relu = 0;" in c and "bias = 1.5..2 across examples." in c
    assert "Not drawn" not in energy_caption({})


def test_nonfinite_term_is_not_called_constant(monkeypatch, tmp_path):
    """A term with a NaN (a diverged run) is never 'unchanged': it is drawn (its panel says what is finite)."""
    e = _energies()
    e["relu"][0, 1] = float("nan")
    seen, _ = _draw(e, monkeypatch, tmp_path)
    assert any(t.startswith("term: relu") for t in seen["titles"])


def test_every_text_is_readable_at_1280_px(monkeypatch, tmp_path):
    """The figure is the README's first (shown at most 1280 px wide): every text of it -- the title, the panels'
    titles, axis labels, tick labels, legends, the caption -- is at least 13 px high there (its size in points at
    the figure's 100 dpi, scaled to 1280 px), so legends at 8 pt, a caption at 8.5 (10-11 px) or panel titles at
    9 (12 px) in a 1380 px figure fail."""
    from matplotlib.text import Text

    seen = {}
    real = plot_energy.save_figure

    def keep(fig, path, *args, **kwargs):
        out = real(fig, path, *args, **kwargs)          # the title is added there
        seen["fig"], seen["dpi"] = fig, kwargs.get("dpi", args[1] if len(args) > 1 else 110)
        return out

    monkeypatch.setattr(plot_energy, "save_figure", keep)
    plot_energy_descent(_energies(), str(tmp_path / "e.png"), "default (guaranteed): 0 increases")
    fig, dpi = seen["fig"], seen["dpi"]
    scale = min(1.0, 1280 / (fig.get_figwidth() * dpi))
    texts = [t for t in fig.findobj(Text) if t.get_text().strip() and t.get_visible()]
    assert len(texts) > 30                                              # ticks, labels, titles, legends, caption
    small = {t.get_text(): round(t.get_fontsize() * dpi / 72 * scale, 1) for t in texts
             if t.get_fontsize() * dpi / 72 * scale < 13}
    assert not small, small
