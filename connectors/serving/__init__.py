"""`streammargin serve`: the models the Kafka workers learn, followed on their checkpoint topic
and answered over the Open Inference Protocol (KServe's v2 REST), or in-process.

- `follower.py`: `ModelFollower`, the checkpoints followed (no group, no writes), decoded off
  the request path, swapped in atomically; its `predict` is the in-process API;
- `models.py`: `ServedVersion`, `ServingView` (the models served at one moment, which one
  answers a key), `Scorer` (the worker's mapping and `PartitionTask.predict`);
- `protocol.py`: the protocol's requests and responses as validated structures, limits;
- `partitioner.py`: the input partition of a record key (murmur2, crc32);
- `app.py`: `InferenceApp`, the endpoints, on Granian (RSGI); `metrics.py`: Prometheus.
"""

from connectors.serving.follower import FollowerError, ModelFollower
from connectors.serving.models import Scored, ServedVersion, ServingView
from connectors.serving.protocol import Limits, RequestError

__all__ = ["ModelFollower", "FollowerError", "Scored", "ServedVersion", "ServingView", "Limits",
           "RequestError"]
