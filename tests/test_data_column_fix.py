"""A data refusal for missing columns names the config keys that fix it (``data.text_field``,
``data.label_field``) with the columns found as candidates, and the fix it names loads the file."""
import re

import pytest

from experiments.data import DataError, load_dataset
from experiments.data.core import column_fix

ROWS = "".join(f"{'good fine nice' if i % 2 else 'bad poor awful'} {i},{'pos' if i % 2 else 'neg'}\n" for i in range(30))


def _fix(message: str) -> dict:
    """The ``key=value`` pairs of the refusal's suggestion."""
    m = re.search(r"set ((?:data\.\w+=\S+ ?)+)", message)
    assert m, message
    return dict(kv.split("=", 1) for kv in m.group(1).split())


def test_csv_refusal_names_the_keys_and_the_fix_loads(tmp_path):
    path = tmp_path / "own.csv"
    path.write_text("body,topic\n" + ROWS)
    with pytest.raises(DataError) as e:
        load_dataset(str(path))
    msg = str(e.value)
    assert "no column(s) ['text', 'label']; columns found: ['body', 'topic']" in msg     # the old refusal, kept
    assert _fix(msg) == {"data.text_field": "body", "data.label_field": "topic"}
    assert "candidates: ['body', 'topic']" in msg
    s = load_dataset(str(path), text_field="body", label_field="topic")                   # the fix it names works
    assert s.label_names == ["neg", "pos"]


def test_jsonl_refusal_names_the_key_of_the_missing_column_only(tmp_path):
    path = tmp_path / "own.jsonl"
    path.write_text('{"text": "a b", "y": 1}\n')
    with pytest.raises(DataError) as e:
        load_dataset(str(path))
    assert _fix(str(e.value)) == {"data.label_field": "y"}      # one column left: it is the candidate


def test_unclear_names_get_a_placeholder_and_the_candidates():
    hint = column_fix(["text", "label"], ["a", "b"], "text", "label")
    assert "set data.text_field=COLUMN data.label_field=COLUMN" in hint and "candidates: ['a', 'b']" in hint
    assert column_fix([], ["text", "label"], "text", "label") == ""     # nothing missing: nothing added
