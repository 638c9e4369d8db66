"""Run folders kept safe: what lets a run, a checkpoint or a dataset file never be lost or half-written.

* `atomic`: atomic writes (a temporary file, fsync, rename; verified before it replaces anything), reads and
  appends that never follow a link;
* `runlock`: one owner per run folder (the lock, its owner recorded), a run replaced only by a complete one
  (``--overwrite``'s staged swap), the names a run writes;
* `checkpoint_fields`: every field of a checkpoint checked, sealed with its digest;
* `runlog`: ``train.log``, ``metrics.csv``, TensorBoard, the progress bars;
* `fingerprint`: the data fingerprint that ties weights to the words and examples they were trained on;
* `strict_yaml`: the one YAML reader (duplicate keys, depth and aliases refused).

Layer: below both the application (`experiments.app`) and the data package (`experiments.data`), which
import it. May import: the library ([`energies`][energies], [`unfold`][unfold]), nothing else of the project.
"""
