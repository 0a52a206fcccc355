"""`streammargin evaluate`'s readers: ARFF (dense, sparse, nominal, string, date, quoted,
missing), libsvm/svmlight (qid, comments), CSV and JSON lines, gzip of each; the same records as
readers we did not write (scikit-learn's svmlight loader, SciPy's ARFF loader); hostile lines are
bad rows with their file:line, never an exception, never more than the bounds."""

from __future__ import annotations

import gzip
import json
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.evaluate import arff, readers, sources
from connectors.evaluate.records import SourceError

WEATHER = """% Weka's weather data, with a few twists
@RELATION weather

@ATTRIBUTE outlook {sunny, overcast, 'light rain'}
@attribute 'temp (F)' NUMERIC
@attribute humidity real
@attribute windy {TRUE, FALSE}
@attribute note string
@attribute when date "yyyy-MM-dd HH:mm"
@attribute play {yes, no}

@DATA
sunny,85,85,FALSE,'it\\'s hot',"2024-01-01 10:30",no
overcast, 83 , ?, FALSE, "calm, dry", ?, yes
'light rain',70,96,TRUE,?,"2024-01-01 11:00",yes
{0 overcast, 1 64, 6 yes}
{1 72, 4 'a b'}, {0.5}
sunny,80,90,TRUE,x,?,?
sunny,80,90,maybe,x,?,no
sunny,80
"""


def rows_of(path, **kwargs):
    return list(arff.arff_rows(path, **kwargs))


def test_arff_every_attribute_kind(tmp_path):
    path = tmp_path / "weather.arff"
    path.write_text(WEATHER)
    header = arff.read_header(path)
    assert header.classes == ["yes", "no"]
    assert header.nominal_features == ["outlook", "windy"]
    assert [a.kind for a in header.attributes] == [
        "nominal", "numeric", "numeric", "nominal", "string", "date", "nominal"]
    rows = rows_of(path)
    where = [row[0].rsplit(":", 1)[1] for row in rows]
    assert where == ["13", "14", "15", "16", "17", "18", "19", "20"]
    ten_thirty = 1704105000.0
    assert rows[0][1:] == ({"outlook": "sunny", "temp (F)": 85.0, "humidity": 85.0,
                            "windy": "FALSE", "note": "it's hot", "when": ten_thirty}, "no", None)
    # '?' is a missing value: the feature is absent.
    assert rows[1][1:] == ({"outlook": "overcast", "temp (F)": 83.0, "windy": "FALSE",
                            "note": "calm, dry"}, "yes", None)
    assert rows[2][1]["when"] == ten_thirty + 1800
    # Sparse: omitted numeric values are zeros (absent), omitted nominal ones the first value.
    assert rows[3][1:] == ({"outlook": "overcast", "temp (F)": 64.0, "windy": "TRUE"}, "yes",
                           None)
    # ... the class's too; an instance weight is read over.
    assert rows[4][1:] == ({"outlook": "sunny", "temp (F)": 72.0, "windy": "TRUE",
                            "note": "a b"}, "yes", None)
    assert rows[5][3] == "no label (the class value is missing)"
    assert rows[6][3] == "attribute 'windy': 'maybe' is not one of its values"
    assert rows[7][3] == "2 values where the header has 7"


def test_arff_target_and_header_errors(tmp_path):
    path = tmp_path / "weather.arff"
    path.write_text(WEATHER)
    assert arff.read_header(path, "windy").classes == [True, False]  # as parse_label reads them
    with pytest.raises(SourceError, match="no attribute 'wind'"):
        arff.read_header(path, "wind")
    for text, message in [
        ("@relation r\n@attribute a relational\n@data\n", ":2: relational attributes"),
        ("@relation r\n@attribute a numeric\n", "no @data line"),
        ("@relation r\n@attribute a {x, 'y}\n@data\n", ":2: a quote is not closed"),
        ("@relation r\n@attribute a bogus\n@data\n", ":2: unknown type 'bogus'"),
        ("@relation r\nhello\n@data\n", ":2: expected @relation"),
        ("@relation r\n@attribute a numeric\n@attribute a numeric\n@data\n", "appears twice"),
    ]:
        path.write_text(text)
        with pytest.raises(SourceError, match=message):
            arff.read_header(path)


def test_arff_sparse_errors_are_bad_rows(tmp_path):
    path = tmp_path / "sparse.arff"
    path.write_text("@relation s\n@attribute a numeric\n@attribute b numeric\n"
                    "@attribute c {p, q}\n@data\n{0 1, 2 q}\n{0 1, 0 2}\n{5 1}\n{0 x}\n{0 1\n"
                    "{x 1}\n{}\n")
    problems = [row[3] for row in rows_of(path)]
    assert problems == [None, "attribute index 0 appears twice",
                        "attribute index 5 is not in 0..2", "attribute 'a': 'x' is not a number",
                        "a sparse line without its closing }", "'x' is not an attribute index",
                        None]
    assert rows_of(path)[-1][1:3] == ({}, "p")  # every value omitted: the class's first


def test_arff_dense_numeric_is_scipys(tmp_path):
    """SciPy's ARFF loader reads the same values and classes (dense numeric and nominal data)."""
    from scipy.io import arff as scipy_arff

    rng = random.Random(5)
    lines = ["@relation r", "@attribute x0 numeric", "@attribute x1 real",
             "@attribute colour {red, green, 'navy blue'}", "@attribute class {neg, pos}",
             "@data"]
    for _ in range(200):
        colour = rng.choice(["red", "green", "'navy blue'"])
        lines.append(f"{rng.gauss(0, 3):.6g},{rng.uniform(-1, 1):.6g},{colour},"
                     f"{rng.choice(['neg', 'pos'])}")
    path = tmp_path / "r.arff"
    path.write_text("\n".join(lines) + "\n")
    data, _ = scipy_arff.loadarff(str(path))
    rows = rows_of(path)
    assert len(rows) == len(data) == 200
    for (_, x, y, problem), expected in zip(rows, data):
        assert problem is None
        assert x == {"x0": float(expected["x0"]), "x1": float(expected["x1"]),
                     "colour": expected["colour"].decode()}
        assert y == expected["class"].decode()


def test_libsvm_is_scikit_learns(tmp_path):
    """scikit-learn's svmlight loader reads the same labels and values (qid, comments)."""
    from sklearn.datasets import load_svmlight_file

    rng = random.Random(3)
    lines = ["# a header comment"]
    for i in range(300):
        indices = sorted(rng.sample(range(1, 60), rng.randint(0, 8)))
        pairs = " ".join(f"{j}:{rng.gauss(0, 1):.7g}" for j in indices)
        qid = f"qid:{i // 10} " if i % 2 else ""
        lines.append(f"{rng.choice(['+1', '-1'])} {qid}{pairs} # row {i}")
    path = tmp_path / "data.svm"
    path.write_text("\n".join(lines) + "\n")
    X, y = load_svmlight_file(str(path), zero_based=False, n_features=60)
    rows = list(readers.libsvm_rows(path))
    assert len(rows) == 300
    for i, (_, x, label, problem) in enumerate(rows):
        assert problem is None
        assert label == int(y[i])
        row = X[i].toarray().ravel()
        assert x == {j: row[j - 1] for j in x}  # the same values, read from the same text
        assert sorted(j - 1 for j in x) == sorted(np.flatnonzero(row).tolist())


def test_libsvm_bad_lines(tmp_path):
    path = tmp_path / "bad.svm"
    path.write_text("1 1:0.5\n1,2 3:1\n3:1 4:1\n1 2:x\n1 2\n1 -2:1\n1 2:1 2:3\n\n# only\n"
                    "2 qid:7\n")
    assert [row[3] for row in readers.libsvm_rows(path)] == [
        None,
        "label '1,2': several labels (multi-label data) are not a class",
        "no label: the line starts with '3:1'",
        "feature 2: value 'x' is not a number",
        "'2' is not index:value",
        "index -2: expected a non-negative integer",
        "an index appears twice",
        None,
    ]


@pytest.mark.parametrize("kind", ["csv", "jsonl", "arff", "libsvm"])
def test_gzip_reads_the_same_records(kind, tmp_path):
    text = {
        "csv": "a,b,y\n1,2,true\n3,4,false\n",
        "jsonl": '{"x": {"a": 1}, "y": true}\n{"x": {"a": 3}, "y": false}\n',
        "arff": "@relation r\n@attribute a numeric\n@attribute y {t, f}\n@data\n1,t\n3,f\n",
        "libsvm": "1 1:1 2:2\n-1 1:3\n",
    }[kind]
    plain = tmp_path / f"data.{kind}"
    plain.write_text(text)
    packed = tmp_path / f"data.{kind}.gz"  # the name does not matter: the magic bytes do
    packed.write_bytes(gzip.compress(text.encode()))
    target = None if kind in ("arff", "libsvm") else "y"
    read = [list(sources.file_source(kind, path, target).records()) for path in (plain, packed)]
    assert read[0] == read[1] and len(read[0]) == 2


def test_a_truncated_gzip_ends_with_one_bad_row(tmp_path):
    text = "".join(f"1 1:{i}\n" for i in range(20000)).encode()
    path = tmp_path / "cut.svm.gz"
    path.write_bytes(gzip.compress(text)[:-2000])
    rows = list(readers.libsvm_rows(path))
    assert all(problem is None for *_, problem in rows[:-1])
    assert "unreadable data, the file ends here" in rows[-1][3]
    assert 0 < len(rows) < 20000


def test_an_overlong_line_is_one_bad_row_and_never_held(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 64)
    path = tmp_path / "long.csv"
    path.write_text("a,y\n1,true\n" + "1" * 1000 + ",true\n2,false\n")
    rows = list(readers.csv_rows(path, "y"))
    assert [(row[0].rsplit(":", 1)[1], row[3]) for row in rows] == [
        ("2", None), ("3", "line longer than 64 bytes"), ("4", None)]
    path = tmp_path / "long.jsonl"
    path.write_text('{"x": {"a": 1}, "y": 1}\n{"x": {"a": ' + "1" * 1000 + '}, "y": 1}\n')
    assert [row[3] for row in readers.jsonl_rows(path, "y")] == [None, "line longer than 64 bytes"]


def test_a_quoted_csv_field_over_lines_is_one_record(tmp_path):
    path = tmp_path / "quoted.csv"
    path.write_text('a,note,y\n1,"two\nlines",true\n2,"x",false\n')
    rows = list(readers.csv_rows(path, "y"))
    assert [row[1:] for row in rows] == [({"a": 1.0, "note": "two\nlines"}, True, None),
                                         ({"a": 2.0, "note": "x"}, False, None)]
    assert [row[0].rsplit(":", 1)[1] for row in rows] == ["3", "4"]


def test_empty_or_headerless_csv_is_a_source_error(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("")
    with pytest.raises(SourceError, match="is empty"):
        sources.file_source("csv", path, "y")


# Hostile input ---------------------------------------------------------------------------------

VALID = {
    "csv": ("a,b,y\n", "1,2,true\n"),
    "jsonl": ("", '{"x": {"a": 1.5}, "y": 1}\n'),
    "arff": ("@relation r\n@attribute a numeric\n@attribute s string\n@attribute c {u, 'v w'}\n"
             "@attribute y {p, n}\n@data\n", "1.5,'s',u,p\n"),
    "libsvm": ("", "+1 1:0.5 7:2\n"),
}

hostile_lines = st.one_of(
    st.binary(max_size=300),
    st.text(alphabet=st.sampled_from(list("{}[]'\",:?% \t\\qid0123456789.-+eEnaif@xyz\r")),
            max_size=200).map(str.encode),
)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(VALID)), noise=st.lists(hostile_lines, max_size=6),
       gzipped=st.booleans())
def test_hostile_lines_are_rows_or_bad_rows_never_an_exception(tmp_path, kind, noise, gzipped):
    header, good = VALID[kind]
    body = good.encode() + b"\n".join(noise) + b"\n" + good.encode()
    data = header.encode() + body
    path = tmp_path / f"hostile.{kind}"
    path.write_bytes(gzip.compress(data) if gzipped else data)
    target = None if kind in ("arff", "libsvm") else "y"
    source = sources.file_source(kind, path, target)
    rows = list(source.rows())
    assert len(rows) >= 2
    for where, x, y, problem in rows:
        assert where.startswith(f"{path}:")
        int(where.rsplit(":", 1)[1])
        if problem is None:
            assert isinstance(x, dict) and len(x) <= readers.MAX_RECORD_FEATURES
            assert all(isinstance(v, (float, str)) for v in x.values()), x
        else:
            assert isinstance(problem, str) and x is None and y is None
    # The checked records a model gets: finite numbers (or categories), a label; never raises.
    for checked in source.checked(one_hot=source.categorical):
        if isinstance(checked, tuple):
            x, y, _ = checked
            assert all(isinstance(v, str) or math.isfinite(v) for v in x.values())
    survey = sources.survey(source, one_hot=source.categorical)
    assert survey.n_records == len(rows)
    # Past its first record, the survey's census of the labels (CSV: split in C) holds too.
    census = sources.survey(source, one_hot=source.categorical, records=1)
    assert census.n_records <= len(rows) + len(noise) + 2
    assert set(census.labels) >= set(survey.labels)  # every good record's label, at least
    if kind in ("csv", "libsvm", "jsonl"):
        first = rows[0]
        assert first[3] is None  # the valid first line stays valid whatever follows
    json.dumps([str(bad) for bad in survey.bad])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(labels=st.lists(st.sampled_from(["1", "0", "-1", "yes", "no", "", " 2 "]), max_size=60),
       crlf=st.booleans(), last_newline=st.booleans(), after=st.integers(0, 70),
       chunk=st.sampled_from([7, 64, 1 << 20]))
def test_the_fast_label_census_counts_what_the_csv_reader_reads(tmp_path, monkeypatch, labels,
                                                                  crlf, last_newline, after, chunk):
    monkeypatch.setattr(readers, "_CHUNK_BYTES", chunk)
    end = "\r\n" if crlf else "\n"
    lines = ["a,b,y"] + [f"{i},{i % 3},{label}" for i, label in enumerate(labels)]
    text = end.join(lines) + (end if last_newline else "")
    path = tmp_path / "census.csv"
    path.write_text(text, newline="")
    fast = readers.csv_label_counts(path, "y", after, 100)
    slow = readers.count_labels(
        ((line, y) for line, y in readers.csv_labels(path, "y") if y != ""), after, 100)
    assert fast == slow


_CSV_LINES = st.one_of(
    st.lists(st.sampled_from(["1.5", "-2", "", " 3 ", "x", "nan", "1e400", "true", "b"]),
             min_size=1, max_size=5).map(",".join),
    st.sampled_from(["", "   ", '"1,5",2,true', '"a\n b",1,0', "1,2\r", "1,\x002,3", "é,ü,1",
                     "1" * 70 + ",2,3"]),
)


@given(lines=st.lists(_CSV_LINES, max_size=30), block=st.integers(1, 80),
       ending=st.sampled_from(["", "\n"]), gzipped=st.booleans(),
       garbage=st.sampled_from([b"", b"\xff\xfe,1,2\n"]))
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_plain_csv_blocks_give_the_csv_readers_rows(tmp_path, monkeypatch, lines, block, ending,
                                                    gzipped, garbage):
    # (monkeypatch sets the same small limits each example: nothing to reset between them)
    monkeypatch.setattr(readers, "_BLOCK_BYTES", block)  # blocks of a few lines, many of them
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 256)  # the 70-digit field's line is long
    path = tmp_path / ("plain.csv.gz" if gzipped else "plain.csv")
    data = ("a,b,y\n" + "\n".join(lines) + ending).encode() + garbage
    path.write_bytes(gzip.compress(data) if gzipped else data)
    names, position, width = ["a", "b"], 2, 3
    careful = list(readers._quoted_csv_rows(path, names, position, width, 0, 0))
    assert repr(list(readers.csv_rows(path, "y"))) == repr(careful)  # (repr: NaN is NaN)
