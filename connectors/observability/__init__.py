"""What the worker tells about itself: its progressive metrics and its health.

- `metrics.py`: `PartitionMetrics`, each partition's progressive metrics and drift detector
  (River's arithmetic, checkpointed), and `Throughput`, the rates;
- `observability.py`: `WorkerStatus` snapshots, the Prometheus collector, `/healthz`,
  `/readyz` and `/metrics` (`EndpointServer`), JSON log lines and the client's log filters.

Importing the package imports neither River nor the HTTP server: each module imports what it
uses.
"""
