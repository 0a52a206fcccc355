"""A streammargin model inside a River pipeline: progressive validation, then save and restore.

Copy this to start: it scales the features, learns ALMA_p online, reports accuracy and log loss the
way River does, then saves the learnt classifier without pickle (numpy + JSON bytes, safe to read
back from a topic or a bucket) and checks the restored copy predicts exactly the same.

Run: .venv/bin/python examples/river_pipeline.py
"""

from __future__ import annotations

from river import compose, datasets, evaluate, metrics, multiclass, preprocessing

import streammargin
from streammargin import state


def binary() -> None:
    model = compose.Pipeline(
        preprocessing.StandardScaler(),
        streammargin.ALMAClassifier(p=2.0, alpha=0.9),
    )
    accuracy = evaluate.progressive_val_score(datasets.Phishing(), model, metrics.Accuracy())
    print(f"Phishing, StandardScaler | ALMA_2(0.9): {accuracy}")

    alma = model["ALMAClassifier"]
    print(f"  {alma.n_corrections} corrections over {alma.n_trials} examples")
    top = sorted(alma.weights.items(), key=lambda kv: -abs(kv[1]))[:3]
    print("  largest weights:", ", ".join(f"{k}={v:+.3f}" for k, v in top))

    # Safe state: bytes you can store anywhere; loading them never runs code.
    blob = state.dumps(alma.to_state())
    restored = streammargin.from_state(state.loads(blob))
    x = next(iter(datasets.Phishing()))[0]
    x_scaled = model["StandardScaler"].transform_one(x)
    assert restored.predict_proba_one(x_scaled) == alma.predict_proba_one(x_scaled)
    print(f"  saved state: {len(blob):,} bytes; the restored model predicts identically")


def multiclass_one_vs_rest() -> None:
    model = preprocessing.StandardScaler() | multiclass.OneVsRestClassifier(
        streammargin.ALMAClassifier()
    )
    accuracy = evaluate.progressive_val_score(datasets.ImageSegments(), model, metrics.Accuracy())
    print(f"ImageSegments (7 classes), one-vs-rest ALMA_2: {accuracy}")


if __name__ == "__main__":
    binary()
    multiclass_one_vs_rest()
