"""The records `AutoClassifier` keeps until its binary members become one-vs-rest, bounded.

At the third label `streammargin.AutoClassifier` turns each binary member into one-vs-rest: the
model so far becomes the member of the label it learnt as True, and the other label gets a fresh
clone. Without the records that came before, that clone starts cold, however many of its own
records the stream already sent (on the wine data set, ALMA inside Auto lost 2.2 points to ALMA
one-vs-rest from the first record). A `ReplayBuffer` keeps copies of the first records, which
the clone learns at the switch, in order, before the record that brought the third label; then
the buffer is dropped.

Bounded by two constants: at most `MAX_RECORDS` records, each of at most `MAX_ENTRIES` features
whose names take at most `features.MAX_NAME_BYTES` bytes of JSON (a record with more features
or a longer name is not kept: its names could take any memory). The memory this takes, counted
as `memory.memory_size` counts a model's (values, their columns, names as JSON), is at most

    MAX_BYTES = MAX_RECORDS x (16 + MAX_ENTRIES x (16 + MAX_NAME_BYTES + 1))
              = 100 x (16 + 256 x 145) = 3,713,600 bytes (3.54 MiB)

(per record: its label and its number of entries as int64; per entry: its value and its name's
column, 8 bytes each, and at worst a name of its own), and that bounds what its safe state adds
to a checkpoint too.
"""

from __future__ import annotations

import typing

import numpy as np

from streammargin import state
from streammargin.errors import InvalidInput, StateError
from streammargin.features import MAX_NAME_BYTES, name_json

__all__ = ["MAX_BYTES", "MAX_ENTRIES", "MAX_RECORDS", "ReplayBuffer"]

#: The most records a buffer keeps (the first ones that fit).
MAX_RECORDS = 100
#: The most features a kept record has; a wider record is not kept.
MAX_ENTRIES = 256
#: The most bytes a buffer holds (see the module's docstring).
MAX_BYTES = MAX_RECORDS * (16 + MAX_ENTRIES * (16 + MAX_NAME_BYTES + 1))

_STATE_KEYS = ("names", "labels", "sizes", "columns", "values")


class ReplayBuffer:
    """Copies of the first `MAX_RECORDS` records that fit, each with its label's index.

    A record is kept as two tuples, its names (immutable: str, int, float, bool, None or tuples
    of them, what a model can save) and its values as floats, so a caller that later changes
    the dict it passed changes nothing here.
    """

    def __init__(self) -> None:
        self._records: list[tuple[int, tuple, tuple]] = []  # (label index, names, values)

    def __len__(self) -> int:
        return len(self._records)

    def add(self, x: dict, label: int) -> bool:
        """Keep a copy of `x` (a record a model has just learnt, so its values are finite
        reals) with `label`, the index of its label; False if it is not kept: the buffer is
        full, or `x` has more than `MAX_ENTRIES` features or a name longer than `MAX_NAME_BYTES`
        in JSON."""
        if len(self._records) >= MAX_RECORDS or len(x) > MAX_ENTRIES:
            return False
        names = tuple(x)
        try:
            if any(len(name_json(name)) > MAX_NAME_BYTES for name in names):
                return False
        except InvalidInput:  # a name without a safe state (a model refuses to learn one)
            return False
        self._records.append((label, names, tuple(float(v) for v in x.values())))
        return True

    def records(self) -> typing.Iterator[tuple[dict, int]]:
        """(a fresh dict of the record, its label's index), in the order they were added."""
        for label, names, values in self._records:
            yield dict(zip(names, values)), label

    def memory_size(self) -> int:
        """Bytes as `memory.memory_size` counts a model's: 16 per record (its label and size),
        16 per entry (value and column), and each distinct name's JSON plus one."""
        names = {
            name_json(name) for _, record_names, _ in self._records for name in record_names
        }
        entries = sum(len(values) for _, _, values in self._records)
        return 16 * len(self._records) + 16 * entries + sum(len(text) + 1 for text in names)

    # Safe state ---------------------------------------------------------------------------------

    def to_state(self) -> dict:
        """The distinct names (`state.encode_name`, in order of first use), and per record its
        label index and number of entries; per entry its name's column and its value."""
        columns_of: dict[str, int] = {}  # a name's JSON text -> its column
        names, labels, sizes, columns, values = [], [], [], [], []
        for label, record_names, record_values in self._records:
            labels.append(label)
            sizes.append(len(record_names))
            for name in record_names:
                text = name_json(name)
                if text not in columns_of:
                    columns_of[text] = len(names)
                    names.append(state.encode_name(name))
                columns.append(columns_of[text])
            values.extend(record_values)
        return {
            "names": names,
            "labels": np.array(labels, dtype=np.int64),
            "sizes": np.array(sizes, dtype=np.int64),
            "columns": np.array(columns, dtype=np.int64),
            "values": np.array(values, dtype=np.float64),
        }

    @classmethod
    def from_state(cls, data: typing.Any, n_labels: int) -> ReplayBuffer:
        """Rebuild a buffer from `to_state()`; `StateError` for anything malformed.

        Checked: the fields; the names (at most MAX_RECORDS x MAX_ENTRIES, each a valid encoded
        name of at most MAX_NAME_BYTES of JSON, distinct, every one used); the arrays (int64
        label indices in [0, n_labels) and sizes in [0, MAX_ENTRIES], at most MAX_RECORDS of
        each; int64 columns of existing names and finite float64 values, as many as the sizes
        add up to); and that no record holds one name twice.
        """
        where = "AutoClassifier state: replay"
        if type(data) is not dict or set(data) != set(_STATE_KEYS):
            raise StateError(f"{where} must have exactly the fields {list(_STATE_KEYS)}")
        encoded = data["names"]
        if type(encoded) is not list or len(encoded) > MAX_RECORDS * MAX_ENTRIES:
            raise StateError(f"{where}: names must be a list of at most "
                             f"{MAX_RECORDS * MAX_ENTRIES}")
        names, texts = [], set()
        for item in encoded:
            name = state.decode_name(item)
            text = name_json(name)
            if len(text) > MAX_NAME_BYTES or text in texts:
                raise StateError(f"{where}: a name is longer than {MAX_NAME_BYTES} bytes of JSON "
                                 "or appears twice")
            texts.add(text)
            names.append(name)
        arrays = {}
        for key, dtype in (("labels", np.int64), ("sizes", np.int64), ("columns", np.int64),
                           ("values", np.float64)):
            array = data[key]
            if not isinstance(array, np.ndarray) or array.dtype != dtype or array.ndim != 1:
                raise StateError(f"{where}: {key} must be a one-dimensional "
                                 f"{np.dtype(dtype).name} array")
            arrays[key] = array
        labels, sizes = arrays["labels"], arrays["sizes"]
        if len(labels) != len(sizes) or len(labels) > MAX_RECORDS:
            raise StateError(f"{where}: labels and sizes must have one length, at most "
                             f"{MAX_RECORDS}")
        if np.any(labels < 0) or np.any(labels >= n_labels):
            raise StateError(f"{where}: a label index is not one of the {n_labels} labels")
        if np.any(sizes < 0) or np.any(sizes > MAX_ENTRIES):
            raise StateError(f"{where}: a record size is not in [0, {MAX_ENTRIES}]")
        total = int(sizes.sum())  # at most MAX_RECORDS x MAX_ENTRIES: no overflow
        columns, values = arrays["columns"], arrays["values"]
        if len(columns) != total or len(values) != total:
            raise StateError(f"{where}: columns and values must hold the {total} entries the "
                             "sizes add up to")
        if np.any(columns < 0) or np.any(columns >= len(names)):
            raise StateError(f"{where}: a column is not one of the {len(names)} names")
        if len(np.unique(columns)) != len(names):
            raise StateError(f"{where}: a name is not used by any record")
        if not np.isfinite(values).all():
            raise StateError(f"{where}: values must be finite")
        buffer = cls()
        start = 0
        for label, size in zip(labels.tolist(), sizes.tolist()):
            record_names = tuple(names[c] for c in columns[start : start + size].tolist())
            if len(set(record_names)) != size:  # 1, 1.0 and True are one key of a dict
                raise StateError(f"{where}: a record holds a name twice")
            record_values = tuple(values[start : start + size].tolist())
            buffer._records.append((label, record_names, record_values))
            start += size
        return buffer
