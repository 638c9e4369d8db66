"""Tests of the TF-IDF + logistic regression baseline (experiments.app.tfidf), offline and small."""
import json
import math
import random
import warnings

import numpy as np
import pytest
import torch

from experiments.app import tfidf as T
from experiments.data import DataError, Splits, split_examples


def synthetic_splits(n=300, classes=3, seed=0) -> Splits:
    """Separable toy texts: each class has its own cue words, mixed with shared noise words."""
    rng = random.Random(seed)
    cues = [["alpha", "apple", "amber"], ["bravo", "banana", "blue"], ["charlie", "cherry", "crimson"]][:classes]
    noise = ["the", "a", "film", "movie", "was", "is", "very", "quite", "really", "story"]
    ex = []
    for i in range(n):
        lab = i % classes
        words = rng.sample(noise, 5) + rng.sample(cues[lab], 2)
        rng.shuffle(words)
        ex.append((" ".join(words) + f" #{i}", lab))
    tr, va, te = split_examples(ex, seed)
    return Splits(tr, va, te, classes, [f"c{k}" for k in range(classes)], "synthetic")


def test_ngrams():
    assert T.ngrams(["a", "b", "c"]) == ["a", "b", "c", "a b", "b c"]
    assert T.ngrams(["a", "b", "c"], (2, 3)) == ["a b", "b c", "a b c"]
    assert T.ngrams(["a"], (2, 2)) == []


def test_vectorizer_idf_norm_min_df_unseen():
    train = ["good movie", "bad movie", "good good fun"]
    vec = T.TfidfVectorizer((1, 1)).fit(train)
    assert sorted(vec.index) == ["bad", "fun", "good", "movie"]
    n = 3
    assert float(vec.idf[vec.index["good"]]) == pytest.approx(math.log((1 + n) / (1 + 2)) + 1)
    X = vec.transform(train + ["unseen words only", ""]).to_dense()
    assert X.dtype == torch.float64 and X.shape == (5, 4)
    assert torch.allclose(X[:3].norm(dim=1), torch.ones(3, dtype=torch.float64))
    assert (X[3:] == 0).all()
    row = X[2]                                   # tf(good) = 2, tf(fun) = 1
    ratio = row[vec.index["good"]] / row[vec.index["fun"]]
    assert float(ratio) == pytest.approx(2 * float(vec.idf[vec.index["good"]] / vec.idf[vec.index["fun"]]))
    sub = T.TfidfVectorizer((1, 1), sublinear_tf=True).fit(train).transform(train).to_dense()
    r = sub[2][vec.index["good"]] / sub[2][vec.index["fun"]]
    assert float(r) == pytest.approx((1 + math.log(2)) * float(vec.idf[vec.index["good"]] / vec.idf[vec.index["fun"]]))
    assert sorted(T.TfidfVectorizer((1, 2), min_df=2).fit(train).index) == ["good", "movie"]
    with pytest.raises(DataError):
        T.TfidfVectorizer((2, 1))


def test_fit_logreg_reaches_the_optimum():
    scipy_opt = pytest.importorskip("scipy.optimize")
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(60, 8, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (60,), generator=gen)
    C = 0.7
    with warnings.catch_warnings():
        warnings.simplefilter("error")         # no "stopped before convergence" warning
        W, b = T.fit_logreg(X.to_sparse_csr(), y, 3, C, tol=1e-7)

    def objective(theta):
        Wt = torch.tensor(theta[:24]).view(8, 3)
        bt = torch.tensor(theta[24:])
        logits = X @ Wt + bt
        return float(C * torch.nn.functional.cross_entropy(logits, y, reduction="sum") + 0.5 * (Wt * Wt).sum())

    ref = scipy_opt.minimize(objective, np.zeros(27), method="L-BFGS-B", options={"gtol": 1e-10, "maxiter": 5000})
    ours = objective(np.concatenate([W.reshape(-1).numpy(), b.numpy()]))
    assert ours <= ref.fun + 1e-6


def test_tfidf_logreg_separable():
    s = synthetic_splits()
    res = T.tfidf_logreg(s, Cs=(0.5, 4))
    assert res["test_accuracy"] > 0.9 and res["val_accuracy"] > 0.9
    assert res["best_C"] in (0.5, 4) and res["features"] > 0 and res["seconds"] >= 0
    assert set(res["val_accuracy_by_C"]) == {"0.5", "4"}
    again = T.tfidf_logreg(s, Cs=(0.5, 4))
    assert again["test_accuracy"] == res["test_accuracy"] and again["best_C"] == res["best_C"]


def test_tfidf_logreg_rejects_bad_Cs():
    with pytest.raises(DataError):
        T.tfidf_logreg(synthetic_splits(30), Cs=())
    with pytest.raises(DataError):
        T.tfidf_logreg(synthetic_splits(30), Cs=(1, -2))


def test_cli_on_a_csv_file(tmp_path, capsys):
    s = synthetic_splits(120, classes=2)
    path = tmp_path / "toy.csv"
    path.write_text("text,label\n" + "".join(f"{t},{['neg', 'pos'][lab]}\n" for t, lab in s.train + s.val + s.test))
    rc = T.main(["--dataset", str(path), "--json", "--Cs", "1", "4"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1
    res = json.loads(out[-1])
    assert res["test_accuracy"] > 0.9 and res["sizes"] == {"train": 96, "val": 12, "test": 12}
    rc = T.main(["--dataset", str(path), "--Cs", "1"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 2 and json.loads(out[-1])["best_C"] == 1


def test_cli_unknown_dataset_exit_2(capsys):
    assert T.main(["--dataset", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown dataset" in err and "rotten_tomatoes" in err
