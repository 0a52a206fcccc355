"""Ahead-of-time compiled entry points: what they would give a fresh worker process.

Issue 14's start-up targets (first prediction <= 5 s with an empty numba cache, <= 150 MiB RSS
before the first record) are out of reach for the JIT: the budget kernel models compile 6.6-10 s
of code before their first prediction, and numba itself is ~130 MiB once any compiled function is
loaded (`benchmarks/cold_start.py`, `benchmarks/worker_rss.py`). This benchmark measures the
lever that would reach both, on two models' per-record entry points: ALMA's `learn_then_predict`
(the whole of its per-record numba work) and BudgetPerceptron's `score_keep_row` and `learn` (the
default merge policy, the largest compile of all). `numba.pycc` compiles them, with the
signatures the models bind (`streammargin.jit.entry.EntryPoint`), into an extension module that
imports without numba; numba marks `numba.pycc` as pending deprecation, which is this lever's
risk.

It prints, each step in a fresh process:

- the build: seconds to compile the module with an empty numba cache (what an install or an
  image build would pay once);
- the import: seconds and RSS of a process that imports only numpy and the module (numba not
  imported, checked);
- the results: the compiled module against the JIT on a stream (ALMA: 3,000 records of 10
  features; BudgetPerceptron: 1,500 Bananas records, budget 50, so that merges happen), every
  score and the final state compared bit for bit;
- the call: nanoseconds per call of each, the same arguments, taking turns.

Run: .venv/bin/python benchmarks/aot_probe.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
MODULE = "streammargin_aot_probe"

BUILD = textwrap.dedent(
    """
    import json, sys, time, warnings
    started = time.perf_counter()
    sys.path.insert(0, sys.argv[1])
    warnings.simplefilter("ignore")  # numba.pycc's pending deprecation
    from numba import typeof, types
    from numba.pycc import CC

    import streammargin
    from streammargin import alma
    from streammargin.jit import alma as alma_jit
    from streammargin.jit import budget_perceptron as bp_jit

    cc = CC(sys.argv[3])
    cc.output_dir = sys.argv[2]
    cc.verbose = False
    cc.export("alma_learn_then_predict", types.float64(*alma._LEARN_THEN_PREDICT.signature))(
        alma_jit.learn_then_predict.py_func
    )
    model = streammargin.BudgetPerceptron()
    model.learn_one({"a": 1.0}, True)
    idx, val = model._features.encode({"a": 1.0}, False)
    score_args = (model._support, model._slots, model._st, idx, val, model._row)
    learn_args = (model._support, model._slots, model._st, model._gram_inv, idx, val, 1.0,
                  model._row)
    cc.export("bp_score_keep_row", types.float64(*map(typeof, score_args)))(
        bp_jit.score_keep_row.py_func
    )
    cc.export("bp_learn", types.int64(*map(typeof, learn_args)))(bp_jit.learn.py_func)
    cc.compile()
    print(json.dumps({"build_s": time.perf_counter() - started}))
    """
)

IMPORT = textwrap.dedent(
    """
    import json, sys, time
    started = time.perf_counter()
    sys.path.insert(0, sys.argv[1])
    import numpy
    import importlib
    importlib.import_module(sys.argv[2])
    seconds = time.perf_counter() - started
    with open("/proc/self/status") as status:
        rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    print(json.dumps({"import_s": seconds, "rss_mib": rss_kib / 1024,
                      "numba_imported": "numba" in sys.modules}))
    """
)

COMPARE = textwrap.dedent(
    """
    import importlib, json, random, sys, time
    sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2])
    import numpy as np
    from river import datasets

    import streammargin
    from streammargin.jit import budget_perceptron as bp_jit
    aot = importlib.import_module(sys.argv[3])

    def per_call_ns(function, args, n=100_000):
        started = time.perf_counter()
        for _ in range(n):
            function(*args)
        return 1e9 * (time.perf_counter() - started) / n

    out = {}
    # ALMA: the model's own bound entry point against the compiled module, twin states.
    rng = random.Random(0)
    records = [({f"x{j}": rng.gauss(0, 1) for j in range(10)}, rng.random() < 0.5)
               for _ in range(3000)]
    model = streammargin.ALMAClassifier()
    for x, y in records[:10]:
        model.predict_one(x)
        model.learn_one(x, y)
    model._flush()
    jit_entry = model._learn_then_predict
    vectors_a, st_a = model._vectors.copy(), model._st.copy()
    vectors_b, st_b = model._vectors.copy(), model._st.copy()
    same = True
    for x, y in records[10:]:
        idx, packed = model._features.encode_packed(x, True)
        target = 1.0 if y else -1.0
        same &= (jit_entry(vectors_a, st_a, idx, packed, target, idx, packed)
                 == aot.alma_learn_then_predict(vectors_b, st_b, idx, packed, target, idx, packed))
    same &= np.array_equal(vectors_a, vectors_b) and np.array_equal(st_a, st_b)
    args = (vectors_a, st_a, idx, packed, 1.0, idx, packed)
    twin = (vectors_b, st_b, idx, packed, 1.0, idx, packed)
    turns = [(per_call_ns(jit_entry, args), per_call_ns(aot.alma_learn_then_predict, twin))
             for _ in range(3)]
    out["alma"] = {"identical": bool(same), "jit_ns": min(t[0] for t in turns),
                   "aot_ns": min(t[1] for t in turns)}

    # BudgetPerceptron: twin models, one through numba's dispatch, one through the module.
    a = streammargin.BudgetPerceptron(budget=50)
    b = streammargin.BudgetPerceptron(budget=50)
    same = True
    for x, y in datasets.Bananas().take(1500):
        target = 1.0 if y else -1.0
        ia, va = a._features.encode(x, True)
        ib, vb = b._features.encode(x, True)
        a._reserve(a._features.n_columns)
        b._reserve(b._features.n_columns)
        same &= (bp_jit.score_keep_row(a._support, a._slots, a._st, ia, va, a._row)
                 == aot.bp_score_keep_row(b._support, b._slots, b._st, ib, vb, b._row))
        same &= (bp_jit.learn(a._support, a._slots, a._st, a._gram_inv, ia, va, target, a._row)
                 == aot.bp_learn(b._support, b._slots, b._st, b._gram_inv, ib, vb, target,
                                 b._row))
    for name in ("_support", "_slots", "_st"):
        same &= np.array_equal(getattr(a, name), getattr(b, name))
    args = (a._support, a._slots, a._st, ia, va, a._row)
    twin = (b._support, b._slots, b._st, ib, vb, b._row)
    turns = [(per_call_ns(bp_jit.score_keep_row, args, 20_000),
              per_call_ns(aot.bp_score_keep_row, twin, 20_000)) for _ in range(3)]
    out["bp"] = {"identical": bool(same), "jit_ns": min(t[0] for t in turns),
                 "aot_ns": min(t[1] for t in turns),
                 "merges": int(a.counters.get("merges", 0))}
    print(json.dumps(out))
    """
)


def child(code: str, *args: str, env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"a step failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="aot-probe-") as out_dir, \
            tempfile.TemporaryDirectory(prefix="numba-empty-") as cache_dir:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
        built = child(BUILD, ROOT, out_dir, MODULE, env=env)
        imported = child(IMPORT, out_dir, MODULE)
        compared = child(COMPARE, ROOT, out_dir, MODULE)
    alma, bp = compared["alma"], compared["bp"]
    print("## Ahead-of-time compiled entry points (numba.pycc), fresh processes\n")
    print("| what | measured |")
    print("| --- | --- |")
    print(f"| build: ALMA learn_then_predict + BudgetPerceptron score_keep_row and learn, "
          f"empty numba cache | {built['build_s']:.1f} s |")
    print(f"| import of the module alone (numpy included) | {imported['import_s']:.3f} s, RSS "
          f"{imported['rss_mib']:.0f} MiB, numba imported: {imported['numba_imported']} |")
    print(f"| ALMA: scores and state against the JIT, 2,990 records | "
          f"{'bit for bit identical' if alma['identical'] else 'DIFFERENT'} |")
    print(f"| ALMA: ns per call, JIT entry point / compiled module | {alma['jit_ns']:.0f} / "
          f"{alma['aot_ns']:.0f} |")
    print(f"| BudgetPerceptron (merge, budget 50, {bp['merges']} merges): scores, updates and "
          f"state against the JIT, 1,500 records | "
          f"{'bit for bit identical' if bp['identical'] else 'DIFFERENT'} |")
    print(f"| BudgetPerceptron score_keep_row: ns per call, numba dispatch / compiled module | "
          f"{bp['jit_ns']:.0f} / {bp['aot_ns']:.0f} |")
    return 0 if alma["identical"] and bp["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
