"""Build the tiny Hugging Face-format fixtures of tests/test_hf_data.py with the real `datasets` library.

Run with a Python that has `datasets` installed (no hub access needed):  python make_fixtures.py OUT_DIR

* ``reviews_disk``: ``DatasetDict.save_to_disk`` of a 3-class sentiment set (train 25 rows, one of them
  labelled -1 = "no label"; validation 6; test 6), ``label`` a ``ClassLabel(names=[negative, neutral, positive])``.
* ``reviews_hub``: the same data as a hub repository snapshot with two configs, written the way
  ``DatasetDict.push_to_hub(repo, config_name)`` writes them (parquet shards ``CONFIG/SPLIT-00000-of-00001.parquet``
  and the README.md dataset card, made by datasets' own card updater on a local folder): ``sentiment`` (the
  set above, the default) and ``topic`` (``ClassLabel(names=[film, music])``, train 20 and test 4, no validation).
* ``plain_hub``: one ``default`` config in ``data/SPLIT-00000-of-00001.parquet`` (push_to_hub's layout without a
  config name): ``ClassLabel(names=[no, yes])``, train 12, validation 3, test 3.
"""
import os
import shutil
import sys

import datasets
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
from datasets.arrow_dataset import _get_updated_dataset_card
from datasets.splits import SplitInfo
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

ADJ = {0: ["dull", "awful", "tedious", "bland", "clumsy", "weak", "grim", "messy", "stale"],
       1: ["ordinary", "average", "plain", "modest", "standard", "usual", "typical", "regular", "so-so"],
       2: ["superb", "lovely", "brilliant", "moving", "sharp", "warm", "vivid", "witty", "bright"]}
NOUNS = ["film", "plot", "cast", "score", "script", "ending", "pace", "camera", "story", "dialogue"]


def sentiment_rows(start, n, unlabeled=0):
    rows = {"text": [], "label": []}
    for i in range(start, start + n):
        lab = i % 3
        rows["text"].append(f"A {ADJ[lab][i % 9]} {NOUNS[i % 10]}, review number {i}.")
        rows["label"].append(lab)
    for k in range(unlabeled):
        rows["text"].append(f"An unrated note number {k} about the {NOUNS[k]}.")
        rows["label"].append(-1)
    return rows


def topic_rows(start, n):
    rows = {"text": [], "label": []}
    for i in range(start, start + n):
        lab = i % 2
        rows["text"].append(f"{['The director', 'The band'][lab]} made item {i} {['on set', 'on stage'][lab]}.")
        rows["label"].append(lab)
    return rows


def sentiment():
    f = Features({"text": Value("string"), "label": ClassLabel(names=["negative", "neutral", "positive"])})
    return DatasetDict({"train": Dataset.from_dict(sentiment_rows(0, 24, unlabeled=1), features=f),
                        "validation": Dataset.from_dict(sentiment_rows(100, 6), features=f),
                        "test": Dataset.from_dict(sentiment_rows(200, 6), features=f)})


def topic():
    f = Features({"text": Value("string"), "label": ClassLabel(names=["film", "music"])})
    return DatasetDict({"train": Dataset.from_dict(topic_rows(0, 20), features=f),
                        "test": Dataset.from_dict(topic_rows(50, 4), features=f)})


def plain():
    f = Features({"text": Value("string"), "label": ClassLabel(names=["no", "yes"])})
    rows = lambda s, n: {"text": [f"Question {i}: is it {['cold', 'warm'][i % 2]}?" for i in range(s, s + n)],
                         "label": [i % 2 for i in range(s, s + n)]}
    return DatasetDict({"train": Dataset.from_dict(rows(0, 12), features=f),
                        "validation": Dataset.from_dict(rows(30, 3), features=f),
                        "test": Dataset.from_dict(rows(40, 3), features=f)})


def push_to_folder(dsd: DatasetDict, root: str, config_name: str = "default", set_default=None):
    """What ``dsd.push_to_hub(repo, config_name=config_name)`` uploads, written into the local folder ``root``."""
    data_dir = config_name if config_name != "default" else "data"           # as push_to_hub chooses it
    fs = DirFileSystem(path=root, fs=LocalFileSystem())
    splits_info, sizes = [], []
    for split, ds in dsd.items():
        path = os.path.join(root, data_dir, f"{split}-00000-of-00001.parquet")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        ds.to_parquet(path)
        sizes.append(os.path.getsize(path))
        splits_info.append(SplitInfo(name=split, num_bytes=ds._estimate_nbytes(), num_examples=len(ds)))
    card, legacy = _get_updated_dataset_card(fs=fs, config_name=config_name, splits_info=splits_info,
                                             features=next(iter(dsd.values())).features, data_dir=data_dir,
                                             set_default=set_default, uploaded_sizes=sizes,
                                             deleted_sizes=[0] * len(sizes), remove_other_splits=True)
    assert legacy is None
    with open(os.path.join(root, "README.md"), "w", encoding="utf-8", newline="") as fh:
        fh.write(str(card))


def main(out):
    print("datasets", datasets.__version__)
    for name in ("reviews_disk", "reviews_hub", "plain_hub"):
        shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    sentiment().save_to_disk(os.path.join(out, "reviews_disk"))
    hub = os.path.join(out, "reviews_hub")
    os.makedirs(hub)
    push_to_folder(sentiment(), hub, "sentiment", set_default=True)
    push_to_folder(topic(), hub, "topic")
    plain_dir = os.path.join(out, "plain_hub")
    os.makedirs(plain_dir)
    push_to_folder(plain(), plain_dir)


if __name__ == "__main__":
    main(sys.argv[1])
