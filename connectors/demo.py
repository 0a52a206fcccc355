"""`streammargin demo`: progressive validation of ALMA on a drifting stream, with live metrics.

(The Kafka version of the demo replaces this once the Kafka worker lands.)
"""

from __future__ import annotations

import argparse
import time


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the demo on a drifting stream")
    parser.add_argument("--size", type=int, default=20000, help="number of records")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from river import drift, metrics, preprocessing, utils
    from river.datasets import synth

    import streammargin

    stream = synth.ConceptDriftStream(
        stream=synth.SEA(seed=1, variant=0),
        drift_stream=synth.SEA(seed=2, variant=3),
        position=args.size // 2,
        width=50,
        seed=3,
    ).take(args.size)
    model = preprocessing.StandardScaler() | streammargin.ALMAClassifier()
    accuracy = metrics.Accuracy()
    rolling = utils.Rolling(metrics.Accuracy(), window_size=1000)
    detector = drift.ADWIN()
    start = time.perf_counter()
    for i, (x, y) in enumerate(stream, 1):
        y_pred = model.predict_one(x)
        accuracy.update(y, y_pred)
        rolling.update(y, y_pred)
        detector.update(float(y_pred != y))
        if detector.drift_detected:
            print(f"  drift detected at record {i}")
        model.learn_one(x, y)
        if i % 5000 == 0:
            rate = i / (time.perf_counter() - start)
            print(f"{i:>7} records  {rate:>8.0f}/s  accuracy {accuracy.get():.4f}  rolling {rolling.get():.4f}")
    print(f"final: {accuracy}")
    return 0
