"""Network partitions, repeated: what tests/test_outages.py checks once, at the issue's sizes.

Two test hosts on this machine (network namespaces joined by a veth pair, neither with a default
route: tests/netns_hosts.py): the broker on one, a `streammargin kafka` worker on the other.
Half of the records are produced, the worker predicts them and waits caught up, the link is cut
silently for `--cuts` seconds, healed, and a second later the other half is produced
(tests/outage_scenario.py). A run passes when the worker exits 0 at idle having predicted every
input offset, repeats no more than the records since a checkpoint, ends with the model of an
uninterrupted run, said once that contact was lost and once that it was back, answered /readyz
503 only past the session timeout and 200 again after the heal, and counted the outage.

Per case (transport x cut) it prints the runs passed, the stderr lines written at INFO from the
cut until 5 s after the heal (the issue's limit: 25 for a 45 s outage), the summary's
`records_per_s`, and what failed. Repeats catch a one-in-three failure: 8 runs miss it with
probability (2/3)^8 = 4%.

Needs root (network namespaces). Run:
    .venv/bin/python benchmarks/outage_faults.py [--broker apache-kafka|tansu] [--cuts 20,45]
        [--repeats 8] [--records 30000] [--idle-timeout 20] [--transports kafka-python,librdkafka]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import common  # (this folder: the script's own)


def main() -> int:
    common.exit_on_sigterm()  # (a kill stops the broker too)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default="apache-kafka", choices=["apache-kafka", "tansu"])
    parser.add_argument("--cuts", default="4,10,20,45", help="seconds, comma-separated")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--records", type=int, default=30_000, help="per partition (two)")
    parser.add_argument("--idle-timeout", type=float, default=20.0)
    parser.add_argument("--transports", default="kafka-python,librdkafka")
    args = parser.parse_args()

    import netns_hosts
    import outage_scenario

    from connectors.kafka.broker import make_broker

    missing = netns_hosts.unavailable()
    if missing:
        print(f"cannot make test hosts here: {missing}")
        return 1
    cuts = [float(c) for c in args.cuts.split(",")]
    transports = args.transports.split(",")
    results: dict[tuple[str, float], list] = {}
    with tempfile.TemporaryDirectory() as tmp, netns_hosts.TestHosts() as hosts:
        broker = make_broker(args.broker, host=netns_hosts.BROKER_ADDRESS,
                             log_path=pathlib.Path(tmp, "broker.log"))
        with hosts.entered(hosts.broker_host):
            broker.start()
        try:
            print(f"broker: {args.broker} at {broker.bootstrap_servers} on the broker host; "
                  f"2 x {args.records:,} records, session timeout "
                  f"{outage_scenario.SESSION_MS} ms, --idle-timeout {args.idle_timeout:g}",
                  flush=True)
            for repeat in range(args.repeats):
                # The cases take turns, so that a slow spell of the machine hits them all.
                for cut in cuts:
                    for transport in transports:
                        workdir = pathlib.Path(tmp, f"{transport}-{cut:g}-{repeat}")
                        workdir.mkdir()
                        try:
                            outcome = outage_scenario.run_partition(
                                hosts, broker.bootstrap_servers, transport, cut, args.records,
                                workdir, idle_timeout=args.idle_timeout)
                            broken = outage_scenario.check(outcome)
                        except Exception as error:  # a harness failure is a failed run too
                            outcome, broken = None, [f"{type(error).__name__}: {error}"]
                        results.setdefault((transport, cut), []).append((outcome, broken))
                        state = "ok" if not broken else "FAILED: " + broken[0].splitlines()[0]
                        lines = outcome.log_lines_in_outage if outcome else "-"
                        print(f"  {repeat + 1}/{args.repeats} {transport} cut {cut:g} s: "
                              f"{state} ({lines} log lines)", flush=True)
        finally:
            hosts.heal()
            broker.stop()
    print()
    print("| transport | cut (s) | runs passed | log lines, cut to heal + 5 s (max) "
          "| records_per_s (median) | failures |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for (transport, cut), runs in results.items():
        passed = sum(1 for _, broken in runs if not broken)
        lines = [o.log_lines_in_outage for o, _ in runs if o is not None]
        rates = [o.summary.get("records_per_s", 0) for o, _ in runs if o is not None]
        failures = sorted({b[0].splitlines()[0][:80] for _, b in runs if b})
        print(f"| {transport} | {cut:g} | {passed}/{len(runs)} | {max(lines, default=0)} "
              f"| {statistics.median(rates) if rates else 0:,.0f} | {'; '.join(failures)} |")
    return 0 if all(not b for runs in results.values() for _, b in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
