"""Columnar files through ``pyarrow``: parquet (the GloVe vocabulary, hub snapshots of Hugging Face datasets)
and Arrow IPC streams (``save_to_disk`` folders). Every failure to read is a `DataError` naming the file.
"""
from __future__ import annotations

import pathlib

from .core import DataError

#: what reading a file that is not what it claims can raise, besides pyarrow's own ``ArrowException``s
_READ_ERRORS = (OSError, ValueError, EOFError, TypeError, KeyError, IndexError, NotImplementedError)


def _pyarrow():
    """``(pyarrow, pyarrow.parquet)``, imported on first use; a `DataError` when not installed."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as e:
        raise DataError(f"reading parquet and Arrow files needs the `pyarrow` package (pip install pyarrow): "
                        f"{e}") from None
    return pyarrow, pyarrow.parquet


def read_parquet_strings(data: bytes) -> list[str | None]:
    """The values of the single string column of the parquet file ``data`` (bytes), in row order.

    Nulls come back as ``None``. A file that is not parquet, holds more or fewer than one column, or a column
    that is not of a string type is a `DataError`.
    """
    pa, pq = _pyarrow()
    try:
        table = pq.read_table(pa.BufferReader(memoryview(data)))
    except (pa.ArrowException, *_READ_ERRORS) as e:
        raise DataError(f"cannot read parquet data ({type(e).__name__}: {e})") from None
    if table.num_columns != 1:
        raise DataError(f"cannot read parquet data (expected one column, found {table.num_columns}: "
                        f"{table.column_names})")
    column = table.column(0)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise DataError(f"cannot read parquet data (column {table.column_names[0]!r} is of type {column.type}, "
                        "not a string)")
    return column.to_pylist()


def read_schema(path: pathlib.Path):
    """The Arrow schema of a ``.parquet`` file or an Arrow IPC (stream or file) ``.arrow`` file."""
    pa, pq = _pyarrow()
    try:
        if path.suffix == ".parquet":
            return pq.read_schema(path)
        return _open_ipc(pa, path).schema
    except (pa.ArrowException, *_READ_ERRORS) as e:
        raise DataError(f"{path}: cannot read ({type(e).__name__}: {e})") from None


def read_columns(path: pathlib.Path, columns: list[str]) -> dict[str, list]:
    """``{column: values}`` of the named columns of a ``.parquet`` or ``.arrow`` file, in row order."""
    pa, pq = _pyarrow()
    try:
        if path.suffix == ".parquet":
            table = pq.read_table(path, columns=columns)
        else:
            table = _open_ipc(pa, path).read_all().select(columns)
        return {c: table.column(c).to_pylist() for c in columns}
    except (pa.ArrowException, *_READ_ERRORS) as e:
        raise DataError(f"{path}: cannot read ({type(e).__name__}: {e})") from None


def _open_ipc(pa, path: pathlib.Path):
    """A reader of the Arrow IPC file ``path``: the stream format ``save_to_disk`` writes, or the file format."""
    source = pa.memory_map(str(path))
    try:
        return pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        return pa.ipc.open_file(source)
