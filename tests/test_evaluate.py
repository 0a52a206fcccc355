"""`streammargin evaluate` and its library: the numbers of River's progressive_val_score."""

from __future__ import annotations

import json

import pytest
from river import datasets, evaluate, linear_model, metrics, preprocessing

import streammargin
from connectors import cli, evaluation


@pytest.mark.parametrize("delay", [0, 25])
def test_accuracy_equals_rivers_progressive_val_score(delay):
    def make_models():
        return {
            "alma": preprocessing.StandardScaler() | streammargin.ALMAClassifier(),
            "river pa": preprocessing.StandardScaler() | linear_model.PAClassifier(),
        }

    results = evaluation.evaluate(make_models(), lambda: datasets.Phishing(), delay=delay)
    for result, model in zip(results, make_models().values()):
        expected = evaluate.progressive_val_score(
            datasets.Phishing(), model, metrics.Accuracy(), delay=delay
        )
        assert result.n == 1250
        assert result.accuracy == expected.get()
        assert 0 < result.log_loss < 1
        assert result.curve and all(0 <= acc <= 1 for _, acc in result.curve)


def write_files(tmp_path):
    rows = [({"a": float(i % 7), "b": float(i % 3)}, i % 7 > 3) for i in range(300)]
    csv_path = tmp_path / "data.csv"
    csv_path.write_text("a,b,label\n" + "".join(f"{x['a']},{x['b']},{str(y).lower()}\n" for x, y in rows))
    jsonl_path = tmp_path / "data.jsonl"
    jsonl_path.write_text("".join(json.dumps({"id": str(i), "x": x, "y": y}) + "\n" for i, (x, y) in enumerate(rows)))
    return rows, csv_path, jsonl_path


def test_file_sources_read_the_same_stream(tmp_path):
    rows, csv_path, jsonl_path = write_files(tmp_path)
    from_csv = list(evaluation.iter_csv(csv_path, "label"))
    from_jsonl = list(evaluation.iter_jsonl(jsonl_path, "y"))
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
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nosuchmodel", "--dataset", "Phishing"], "unknown model"),
        (["--model", "river.os.system", "--dataset", "Phishing"], "River estimator"),
        (["--model", "alma(p=__import__('os'))", "--dataset", "Phishing"], "literal"),
        (["--model", "alma", "--dataset", "NoSuchData"], "no River dataset"),
        (["--model", "alma(nonsense=1)", "--dataset", "Phishing"], "bad parameters"),
    ],
)
def test_cli_rejects_bad_specs_clearly(args, message, capsys):
    assert cli.main(["evaluate", *args]) == 2
    assert message in capsys.readouterr().err


def test_bad_values_in_a_file_name_the_feature(tmp_path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("a,label\n1.0,true\noops,false\n")
    assert cli.main(["evaluate", "--model", "alma", "--no-scale", "--csv", str(path), "--target", "label"]) == 1
    assert "'a'" in capsys.readouterr().err
