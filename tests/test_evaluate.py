"""`streammargin evaluate` and its library: the numbers of River's progressive_val_score, bad
records skipped and named, text columns, multiclass streams, failing models, sane rates."""

from __future__ import annotations

import datetime
import io
import json
import re
import sys

import pytest
from river import compose, datasets, evaluate, linear_model, metrics, multiclass, preprocessing

import streammargin
from connectors import cli
from connectors.evaluate import readers, records, runner, sources


@pytest.mark.parametrize("delay", [0, 25])
def test_accuracy_equals_rivers_progressive_val_score(delay):
    def make_models():
        return {
            "alma": preprocessing.StandardScaler() | streammargin.ALMAClassifier(),
            "river pa": preprocessing.StandardScaler() | linear_model.PAClassifier(),
        }

    results = runner.evaluate(make_models(), lambda: datasets.Phishing(), delay=delay)
    for result, model in zip(results, make_models().values()):
        expected = evaluate.progressive_val_score(
            datasets.Phishing(), model, metrics.Accuracy(), delay=delay
        )
        assert result.n == 1250
        assert result.accuracy == expected.get()
        assert 0 < result.log_loss < 1
        assert result.curve and all(0 <= acc <= 1 for _, acc in result.curve)
        assert result.error is None


@pytest.mark.parametrize("delay", [0, 40])
def test_multiclass_accuracy_and_macro_f1_equal_rivers(delay):
    def make_models():
        return {
            "alma one-vs-rest": preprocessing.StandardScaler()
            | streammargin.OneVsRestClassifier(streammargin.ALMAClassifier()),
            "cpm": preprocessing.StandardScaler() | streammargin.ConvexPolytopeClassifier(),
            "river lr one-vs-rest": preprocessing.StandardScaler()
            | multiclass.OneVsRestClassifier(linear_model.LogisticRegression()),
        }

    results = runner.evaluate(
        make_models(), lambda: datasets.ImageSegments(), delay=delay, multiclass=True
    )
    for result, model in zip(results, make_models().values()):
        expected = evaluate.progressive_val_score(
            datasets.ImageSegments(), model, metrics.Accuracy() + metrics.MacroF1(), delay=delay
        )
        accuracy, macro_f1 = expected
        assert result.n == 2310
        assert result.accuracy == accuracy.get()
        # River sums the classes' F1 over a set, in no fixed order: the last bit may differ.
        assert result.macro_f1 == pytest.approx(macro_f1.get(), rel=1e-12)
        assert 0 < result.log_loss < 3


def test_the_progress_reaches_the_last_record():
    calls = []
    runner.evaluate(
        {"alma": streammargin.ALMAClassifier()},
        lambda: datasets.Phishing(),
        on_progress=calls.append,
    )
    assert calls == [1000, 1250]  # it stopped at 1,000 of 1,250


def progress_rates(err: str) -> list[int]:
    return [int(rate.replace(",", "")) for rate in re.findall(r"rec +([\d,]+)/s", err)]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_bar_is_drawn_on_a_terminal_only(capsys, monkeypatch):
    assert cli.main(["evaluate", "--model", "alma", "--dataset", "Phishing"]) == 0
    assert "rec" not in capsys.readouterr().err  # a pipe or a file: no progress lines
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main(["evaluate", "--model", "alma", "--dataset", "Phishing"]) == 0
    err = terminal.getvalue()
    assert "\r" in err and "100.0%" in err and "1,250 rec" in err
    # The rate was computed from the line's first redraw: 386,548,068/s.
    assert all(rate < 5_000_000 for rate in progress_rates(err))


def write_files(tmp_path):
    rows = [({"a": float(i % 7), "b": float(i % 3)}, i % 7 > 3) for i in range(300)]
    csv_path = tmp_path / "data.csv"
    csv_path.write_text("a,b,label\n" + "".join(f"{x['a']},{x['b']},{str(y).lower()}\n" for x, y in rows))
    jsonl_path = tmp_path / "data.jsonl"
    jsonl_path.write_text("".join(json.dumps({"id": str(i), "x": x, "y": y}) + "\n" for i, (x, y) in enumerate(rows)))
    return rows, csv_path, jsonl_path


def test_file_sources_read_the_same_stream(tmp_path):
    rows, csv_path, jsonl_path = write_files(tmp_path)
    from_csv = list(readers.iter_csv(csv_path, "label"))
    from_jsonl = list(readers.iter_jsonl(jsonl_path, "y"))
    assert from_csv == from_jsonl == rows


def test_cli_prints_a_table_and_writes_a_plot(tmp_path, capsys):
    _, csv_path, _ = write_files(tmp_path)
    plot = tmp_path / "curve.png"
    code = cli.main([
        "evaluate", "--model", "alma", "--model", "alma(alpha=0.5, average=False)",
        "--model", "river.linear_model.Perceptron", "--csv", str(csv_path), "--target", "label",
        "--delay", "10", "--plot", str(plot),
    ])
    out = capsys.readouterr().out
    assert code == 0
    assert "alma(alpha=0.5, average=False)" in out and "river.linear_model.Perceptron" in out
    assert "one-vs-rest" not in out  # true/false labels: binary models as they are
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nosuchmodel", "--dataset", "Phishing"], "unknown model"),
        (["--model", "river.os.system", "--dataset", "Phishing"], "River estimator"),
        (["--model", "os.system", "--dataset", "Phishing"], "unknown model"),
        (["--model", "river.preprocessing.StandardScaler", "--dataset", "Phishing"], "not a classifier"),
        (["--model", "alma(p=__import__('os'))", "--dataset", "Phishing"], "literal"),
        (["--model", "alma", "--dataset", "NoSuchData"], "no River dataset"),
        (["--model", "alma", "--dataset", "SEA(nonsense=1)"], "cannot make SEA"),
        (["--model", "alma(nonsense=1)", "--dataset", "Phishing"], "bad parameters"),
        (["--model", "river.linear_model.LogisticRegression(nonsense=1)", "--dataset", "Phishing"],
         "bad parameters"),
        (["--model", "alma", "--dataset", "Phishing", "-n", "0"], "-n 0"),
        (["--model", "alma", "--dataset", "Phishing", "--delay", "-1"], "--delay -1"),
        (["--model", "alma", "--csv", "/no/such/file.csv", "--target", "y"], "no such file"),
        (["--model", "alma", "--csv", "/no/such/file.csv"], "--target"),
    ],
)
def test_cli_rejects_bad_specs_in_two_lines(args, message, capsys):
    assert cli.main(["evaluate", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("streammargin evaluate: ")
    assert lines[1].startswith("  fix: ")


# Bad records ----------------------------------------------------------------------------------


def test_a_bad_json_line_is_named_by_file_and_line_and_skipped(tmp_path, capsys):
    rows, _, jsonl_path = write_files(tmp_path)
    lines = jsonl_path.read_text().splitlines()
    lines[1] = '{"id": "1", "x": {"a": 1.0}, "y": tru'  # the "line 2 column 1 (char 17)"
    lines[5] = '["not", "an", "object"]'
    lines[9] = '{"id": "9", "x": {"a": NaN}, "y": true}'
    lines[12] = '{"id": "12", "x": {"a": 1.0}}'
    bad_path = tmp_path / "bad.jsonl"
    bad_path.write_text("\n".join(lines) + "\n")
    code = cli.main(["evaluate", "--model", "alma", "--jsonl", str(bad_path), "--target", "y"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "296 records" in captured.out and "4 bad records skipped" in captured.out
    assert f"{bad_path}:2: not JSON" in captured.out
    assert f"{bad_path}:6: not a JSON object" in captured.out
    assert f"{bad_path}:10: feature 'a' has value nan" in captured.out
    assert f"{bad_path}:13: no 'y' field" in captured.out
    assert "Traceback" not in captured.err

    # The run is the run on the file without those lines.
    good = [row for i, row in enumerate(rows) if i not in (1, 5, 9, 12)]
    result, = runner.evaluate(
        {"alma": preprocessing.StandardScaler() | streammargin.ALMAClassifier()}, lambda: good
    )
    assert f"{result.accuracy:.4f}" in captured.out


def test_on_bad_record_stop_stops_at_the_first_with_its_place(tmp_path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("a,b,label\n1.0,2.0,true\n3.0,oops,false\n1.0\n")
    args = ["evaluate", "--model", "alma", "--csv", str(path), "--target", "label"]
    assert cli.main([*args, "--on-bad-record", "stop"]) == 1
    err = capsys.readouterr().err
    assert f"{path}:3: feature 'b' has value 'oops'" in err
    assert "--on-bad-record skip" in err and len(err.strip().splitlines()) == 2
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "2 bad records skipped" in out
    assert f"{path}:4: 1 fields where the header has 3" in out


def test_bad_records_of_every_kind_are_set_aside(tmp_path):
    path = tmp_path / "mixed.csv"
    path.write_text(
        "a,b,label\n"
        "1,2,true\n"      # 2: good
        "1,2,\n"          # 3: no label
        "1,2,3,4\n"       # 4: too many fields
        "inf,2,false\n"   # 5: not finite
        "1,,false\n"      # 6: good, b absent
        "\n"              # 7: blank line: nothing
        "2,1,yes\n"       # 8: good, a string label
    )
    source = sources.source_from_args(csv_path=str(path), target="label")
    found = sources.survey(source)
    assert (found.n_records, found.n_good, found.n_bad) == (6, 3, 3)
    assert [bad.where for bad in found.bad] == [f"{path}:3", f"{path}:4", f"{path}:5"]
    assert list(source.records()) == [
        ({"a": 1.0, "b": 2.0}, True), ({"a": 1.0}, False), ({"a": 2.0, "b": 1.0}, "yes")
    ]
    assert not found.binary  # "yes" is no binary coding: models get wrapped one-vs-rest


# Text columns -----------------------------------------------------------------------------------


def shop_csv(tmp_path):
    import random

    rng = random.Random(3)
    path = tmp_path / "shop.csv"
    lines = ["id,price,country,bought"]
    for i in range(400):
        country = rng.choice(["fr", "de", "it"])
        price = rng.uniform(0, 10)
        bought = price + {"fr": 3.0, "de": -3.0, "it": 0.0}[country] > 5.0
        lines.append(f"ev-{i},{price:.3f},{country},{str(bought).lower()}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_text_column_gets_a_clear_message_not_a_traceback(tmp_path, capsys):
    path = shop_csv(tmp_path)
    code = cli.main(["evaluate", "--model", "alma", "--csv", str(path), "--target", "bought"])
    err = capsys.readouterr().err
    assert code == 2
    assert "TypeError" not in err and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 2
    assert "'id', 'country'" in lines[0] and "text" in lines[0] and f"{path}:2" in lines[0]
    assert "--one-hot id --one-hot country" in lines[1] and "--drop id --drop country" in lines[1]


def test_one_hot_encodes_a_text_column_with_rivers_encoder(tmp_path, capsys):
    path = shop_csv(tmp_path)
    code = cli.main([
        "evaluate", "--model", "alma", "--csv", str(path), "--target", "bought",
        "--one-hot", "country", "--drop", "id",
    ])
    out = capsys.readouterr().out
    assert code == 0
    accuracy = float(re.search(r"^alma +400 +([\d.]+)", out, re.M).group(1))
    # The same pipeline by hand, through progressive_val_score.
    source = sources.source_from_args(csv_path=str(path), target="bought")
    model = (
        (compose.Discard("country") | preprocessing.StandardScaler())
        + (compose.Select("country") | preprocessing.OneHotEncoder())
    ) | streammargin.ALMAClassifier()
    expected = evaluate.progressive_val_score(
        list(source.records(one_hot=["country"], drop=["id"])), model, metrics.Accuracy()
    )
    assert accuracy == round(expected.get(), 4)
    assert accuracy > 0.8  # the country matters: without it ALMA cannot learn the rule


def test_unknown_one_hot_columns_are_refused(tmp_path, capsys):
    path = shop_csv(tmp_path)
    code = cli.main(["evaluate", "--model", "alma", "--csv", str(path), "--target", "bought",
                     "--one-hot", "colour"])
    assert code == 2
    assert "--one-hot colour: no such column" in capsys.readouterr().err


def test_a_few_text_values_in_a_numeric_column_are_bad_records(tmp_path):
    path = tmp_path / "typos.csv"
    path.write_text("a,label\n" + "".join(f"{i},true\n" for i in range(20)) + "n/a,false\n")
    found = sources.survey(sources.source_from_args(csv_path=str(path), target="label"))
    assert not found.text_columns
    assert found.n_bad == 1 and found.bad[0].where == f"{path}:22"


# Multiclass and failing models ------------------------------------------------------------------


def test_binary_models_on_a_multiclass_stream_are_wrapped_one_vs_rest(capsys):
    code = cli.main([
        "evaluate", "--model", "river.linear_model.LogisticRegression", "--model", "alma",
        "--model", "convexpolytope", "--dataset", "ImageSegments",
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "7 classes" in out and "macro F1" in out
    assert "river.linear_model.LogisticRegression [one-vs-rest]" in out
    assert "alma [one-vs-rest]" in out
    assert "convexpolytope [one-vs-rest]" not in out  # natively multiclass
    scores = dict(re.findall(r"^(\S+(?: \[one-vs-rest\])?) +2,310 +([\d.]+)", out, re.M))
    assert float(scores["alma [one-vs-rest]"]) > 0.85
    assert float(scores["river.linear_model.LogisticRegression [one-vs-rest]"]) > 0.75


def test_a_failing_model_is_reported_in_one_line_and_the_others_keep_their_results(capsys):
    code = cli.main([
        "evaluate", "--model", "river.naive_bayes.MultinomialNB", "--model", "alma",
        "--dataset", "Phishing",
    ])
    captured = capsys.readouterr()
    assert code == 1
    assert re.search(r"^alma +1,250 +0\.\d{4}", captured.out, re.M)
    failures = [line for line in captured.out.splitlines() if "failed after" in line]
    assert failures == [
        "river.naive_bayes.MultinomialNB: failed after 2 records: ValueError: math domain error"
    ]
    assert "Traceback" not in captured.err


class FailsAfter(linear_model.LogisticRegression):
    def learn_one(self, x, y, **kwargs):
        self.seen = getattr(self, "seen", 0) + 1
        if self.seen > 100:  # learns from 100 records, fails on the 101st
            raise RuntimeError("boom")
        super().learn_one(x, y, **kwargs)


def test_evaluate_keeps_the_figures_of_a_model_that_fails():
    first, second = runner.evaluate(
        {"fails": FailsAfter(), "alma": streammargin.ALMAClassifier()}, lambda: datasets.Phishing()
    )
    assert first.error == "RuntimeError: boom" and first.n == 101  # its prediction was scored
    assert first.accuracy is not None
    assert second.error is None and second.n == 1250


def test_numpy_labels_are_plain_classes_and_bad_labels_bad_records():
    import numpy as np

    empty = frozenset()
    assert records.check_record("r", {"a": 1.0}, np.int64(3), empty, empty) == ({"a": 1.0}, 3)
    assert records.check_record("r", {"a": 1.0}, np.bool_(True), empty, empty)[1] is True
    for label in (np.float64("nan"), [1], {"c": 1}, None, "  "):
        bad = records.check_record("r", {"a": 1.0}, label, empty, empty)
        assert isinstance(bad, records.BadRecord) and "label" in bad.reason


# Delays, the initial window, results files, several streams ------------------------------------


def timed_csv(tmp_path, n=600):
    """A CSV with an ISO timestamp column, records 1 to 3 minutes apart."""
    import random

    rng = random.Random(11)
    path = tmp_path / "timed.csv"
    lines = ["ts,a,b,label"]
    moment = 1_700_000_000
    rows = []
    for _ in range(n):
        moment += rng.randint(60, 180)
        a, b = rng.uniform(-1, 1), rng.uniform(-1, 1)
        label = a + 0.5 * b + rng.gauss(0, 0.3) > 0
        stamp = datetime.datetime.fromtimestamp(moment, datetime.timezone.utc)
        lines.append(f"{stamp.isoformat()},{a:.5f},{b:.5f},{str(label).lower()}")
        rows.append(({"ts": stamp, "a": float(f"{a:.5f}"), "b": float(f"{b:.5f}")}, label))
    path.write_text("\n".join(lines) + "\n")
    return path, rows


def test_a_time_delay_over_a_moment_column_is_rivers(tmp_path, capsys):
    path, rows = timed_csv(tmp_path)
    model = "river.linear_model.LogisticRegression"
    code = cli.main(["evaluate", "--model", model, "--model", "alma", "--csv", str(path),
                     "--target", "label", "--moment", "ts", "--delay", "30m"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "labels 30m late by ts" in out

    def without_ts(pairs):  # River reads the moment from x; the models must not see it
        return compose.Discard("ts") | preprocessing.StandardScaler() | pairs

    for name, estimator in ((model, linear_model.LogisticRegression()),
                            ("alma", streammargin.ALMAClassifier())):
        expected = evaluate.progressive_val_score(
            rows, without_ts(estimator), metrics.Accuracy(), moment="ts",
            delay=datetime.timedelta(minutes=30))
        shown = re.search(rf"^{re.escape(name)} +600 +([\d.]+)", out, re.M).group(1)
        assert float(shown) == round(expected.get(), 4)


def test_a_time_delay_needs_a_moment_and_a_bound(tmp_path, capsys):
    path, _ = timed_csv(tmp_path, 50)
    base = ["evaluate", "--model", "alma", "--csv", str(path), "--target", "label"]
    assert cli.main([*base, "--delay", "30m", "--drop", "ts"]) == 2
    assert "needs --moment" in capsys.readouterr().err
    assert cli.main([*base, "--moment", "ts", "--delay", "30m", "--max-pending", "5"]) == 1
    err = capsys.readouterr().err
    assert "more than 5 records wait for their labels" in err and "--max-pending" in err
    assert cli.main([*base, "--moment", "a", "--delay", "1", "--drop", "ts"]) == 0  # numeric
    assert cli.main([*base, "--moment", "ts", "--delay", "1x"]) == 2
    assert "unknown unit" in capsys.readouterr().err


def test_the_initial_training_window_trains_and_tests_none():
    data = list(datasets.Phishing())
    model = preprocessing.StandardScaler() | linear_model.LogisticRegression()
    result, = runner.evaluate({"lr": model.clone()}, lambda: data, initial_window=300)
    assert result.n == 950
    for x, y in data[:300]:
        model.learn_one(x, y)
    expected = evaluate.progressive_val_score(data[300:], model, metrics.Accuracy())
    assert result.accuracy == expected.get()


def test_results_files_have_a_row_per_model_and_window(tmp_path, capsys):
    _, csv_path, _ = write_files(tmp_path)
    for name in ("results.csv", "results.json"):
        output = tmp_path / name
        code = cli.main(["evaluate", "--model", "alma", "--model", "budgetperceptron", "--csv",
                         str(csv_path), "--target", "label", "--window", "100", "--fading",
                         "0.99", "--output", str(output)])
        assert code == 0
        if name.endswith(".json"):
            rows = json.loads(output.read_text())
        else:
            import csv

            rows = list(csv.DictReader(output.open()))
        assert [(r["model"], int(r["window"]), int(r["records"])) for r in rows] == [
            (model, window, 100 * window) for window in (1, 2, 3)
            for model in ("alma", "budgetperceptron")]
        assert {"kappa_m", "window_kappa_t", "faded_accuracy", "window_auc", "ram_hours",
                "memory_bytes", "seconds"} <= set(rows[0])
        assert rows[0]["auc"] in ("", None)  # AUC is a window's measure only
    out = capsys.readouterr().out
    assert "results: " in out and "(6 rows)" in out


def test_several_streams_give_each_models_mean_rank(tmp_path, capsys):
    _, csv_path, _ = write_files(tmp_path)
    code = cli.main(["evaluate", "--model", "alma", "--model", "river.linear_model.Perceptron",
                     "--dataset", "Phishing", "--csv", str(csv_path), "--target", "label",
                     "--metric", "kappa-m", "--plot", str(tmp_path / "k.png")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "mean rank by kappa_m over 2 streams" in out
    table = out.split("mean rank by kappa_m")[1]
    ranks = dict(re.findall(r"^(\S+) +(\d\.\d\d) ", table, re.M))
    assert sorted(ranks.values()) in (["1.00", "2.00"], ["1.50", "1.50"]) or \
        float(ranks["alma"]) + float(ranks["river.linear_model.Perceptron"]) == 3.0
    assert (tmp_path / "k.png").stat().st_size > 10_000


@pytest.mark.parametrize("kind", ["arff", "libsvm"])
def test_arff_and_libsvm_files_gzip_or_not(kind, tmp_path, capsys):
    import gzip

    rows = list(datasets.Phishing())[:400]
    names = list(rows[0][0])
    if kind == "arff":
        text = "@relation phishing\n" + "".join(f"@attribute {n} numeric\n" for n in names)
        text += "@attribute class {false, true}\n@data\n"
        text += "".join(",".join(str(x[n]) for n in names) + f",{str(y).lower()}\n"
                        for x, y in rows)
    else:
        text = "".join(("+1" if y else "-1") + " " + " ".join(
            f"{i + 1}:{x[n]}" for i, n in enumerate(names) if x[n]) + "\n" for x, y in rows)
    path = tmp_path / f"phishing.{kind}.gz"
    path.write_bytes(gzip.compress(text.encode()))
    assert cli.main(["evaluate", "--model", "alma", f"--{kind}", str(path)]) == 0
    out = capsys.readouterr().out
    assert "400 records, binary labels" in out
    accuracy = float(re.search(r"^alma +400 +([\d.]+)", out, re.M).group(1))
    assert accuracy > 0.75  # (libsvm leaves zeros out: the scaler sees the others only)


def test_bad_metric_and_no_stream_are_refused(capsys):
    assert cli.main(["evaluate", "--model", "alma", "--dataset", "Phishing", "--metric",
                     "f2"]) == 2
    assert "--metric f2: no such measure" in capsys.readouterr().err
    assert cli.main(["evaluate", "--model", "alma"]) == 2
    assert "no stream to evaluate on" in capsys.readouterr().err


class FailingALMA(streammargin.ALMAClassifier):
    def learn_one(self, x, y):
        self.seen = getattr(self, "seen", 0) + 1
        if self.seen > 100:
            raise RuntimeError("boom")
        super().learn_one(x, y)


def test_a_scaled_model_that_fails_to_learn_keeps_its_last_prediction():
    data = list(datasets.Phishing())
    result, = runner.evaluate({"alma": runner.Scaled(FailingALMA())}, lambda: data)
    assert result.error == "RuntimeError: boom" and result.n == 101
    model = preprocessing.StandardScaler() | streammargin.ALMAClassifier()
    expected = evaluate.progressive_val_score(data[:101], model, metrics.Accuracy())
    assert result.accuracy == expected.get()


def test_a_plot_into_a_missing_folder_fails_before_the_run(tmp_path, capsys):
    plot = tmp_path / "no" / "curve.png"
    assert cli.main(["evaluate", "--model", "alma", "--dataset", "Phishing", "--plot",
                     str(plot)]) == 1
    captured = capsys.readouterr()
    assert "prequential evaluation" not in captured.out  # nothing was run
    assert f"--plot {plot}: No such file or directory" in captured.err
