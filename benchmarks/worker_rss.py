"""The Kafka worker's resident memory before its first record, and where it goes.

1. Worker: `streammargin kafka --model alma --scale` on an empty topic of the embedded broker: it
   connects, joins its group, warms its model up (loads the compiled code) and waits. After
   `--seconds` its VmRSS and VmHWM (peak) from /proc. On the ahead-of-time compiled modules
   (`streammargin warmup`, the default once built) and on numba's JIT (`STREAMMARGIN_AOT=0`,
   numba's cache warm), each also with `--warm-up false`.
2. Imports: in a fresh process, the RSS after each step of what the worker loads, cumulative
   (python + numpy, kafka-python, the connector, the model built and run on the compiled
   modules, River's preprocessing, the worker's task), then numba's import and its CPU target
   (what the JIT adds).

Without the compiled modules the worker sat at ~186-231 MB before its first record, ~125 MB of
it numba: importing it maps LLVM (libllvmlite, +64 MB with its Python modules), and loading any
cached function runs `target_context.refresh()`, which imports numba's whole lowering library
(numba.np, scipy.linalg for BLAS) and initialises the code generator (+60 MB). The compiled
modules are plain extension modules (~8 MB for all ten, each loaded when first used).

Run: .venv/bin/python benchmarks/worker_rss.py [--seconds 15]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

STEPS = [
    ("python + numpy", "import numpy"),
    ("+ kafka-python", "import kafka"),
    ("+ connectors.worker", "import connectors.worker.worker, connectors.cli.kafka_command"),
    ("+ ALMA built", "import streammargin; m = streammargin.ALMAClassifier()"),
    ("+ ALMA predict/learn (compiled)", "m.predict_one({'a': 1.0}); m.learn_one({'a': 1.0}, True)"),
    ("+ river.preprocessing", "import river.preprocessing"),
    ("+ the worker task (--scale)", "from connectors.worker.warmup import warm; warm('alma')"),
    ("  (numba imported so far?)", "print('numba imported:', 'numba' in sys.modules)"),
    ("+ numba (the JIT: its import)", "import numba"),
    ("+ numba CPU target", "import numba.np.arraymath"),
]


def status(pid: int | str) -> dict:
    values = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return values


def imports() -> None:
    code = ["import sys; sys.path.insert(0, %r)" % os.path.join(HERE, ".."),
            "def rss():\n    return int(open('/proc/self/statm').read().split()[1]) * "
            "__import__('os').sysconf('SC_PAGE_SIZE') / 2**20",
            "print(f'{\"python\":<30}{rss():8.1f} MB')"]
    for label, step in STEPS:
        code.append(step)
        code.append(f"print(f'{label:<30}{{rss():8.1f}} MB  ({{len(sys.modules)}} modules)')")
    subprocess.run([sys.executable, "-c", "\n".join(code)], check=True)


def worker(bootstrap: str, topic: str, seconds: float, extra: list[str], env: dict) -> dict:
    script = os.path.join(os.path.dirname(sys.executable), "streammargin")
    group = f"rss-{uuid.uuid4().hex[:8]}"
    command = [script, "kafka", "--bootstrap-servers", bootstrap, "--topic", topic,
               "--group-id", group, "--predictions-topic", f"{group}.out",
               "--metrics-topic", f"{group}.metrics", "--dead-letter-topic", f"{group}.dead",
               "--checkpoint-topic", f"{group}.checkpoints", "--model", "alma", "--scale",
               "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000",
               "--log-level", "WARNING", *extra]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, env={**os.environ, **env})
    try:
        time.sleep(seconds)
        if process.poll() is not None:
            raise RuntimeError(f"the worker exited with {process.returncode}")
        return status(process.pid)
    finally:
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    from connectors.kafka.broker import EmbeddedBroker, create_topics

    print("imports, cumulative RSS:")
    imports()
    print()
    with EmbeddedBroker() as broker:
        topic = f"rss-{uuid.uuid4().hex[:8]}"
        create_topics(broker.bootstrap_servers, [topic], partitions=2)
        from streammargin.jit import aot

        if not aot.built():
            print("(the compiled modules are not built for these sources: run `streammargin "
                  "warmup` first, or the first rows measure the JIT too)")
        for label, extra, env in (
            ("compiled modules (default)", [], {}),
            ("compiled, --warm-up false", ["--warm-up", "false"], {}),
            ("JIT (STREAMMARGIN_AOT=0)", [], {"STREAMMARGIN_AOT": "0"}),
            ("JIT, --warm-up false", ["--warm-up", "false"], {"STREAMMARGIN_AOT": "0"}),
        ):
            found = worker(broker.bootstrap_servers, topic, args.seconds, extra, env)
            print(f"{label:<30} before the first record: RSS {found['VmRSS']:6.1f} MB, "
                  f"peak {found['VmHWM']:6.1f} MB (after {args.seconds:.0f} s idle)")


if __name__ == "__main__":
    main()
