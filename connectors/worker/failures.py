"""The errors the worker stops with (`WorkerError`): each message names the cause and the fix,
in a line or two a person can act on."""

from __future__ import annotations


class WorkerError(RuntimeError):
    """The worker cannot go on (refused checkpoint, undecodable batch, failed sends, ...); the
    message names the cause and the fix."""


def _send_failure(what: str, error: BaseException) -> WorkerError:
    """The error to stop with when producing failed: the cause and what to do about it."""
    from kafka import errors

    if isinstance(error, (errors.MessageSizeTooLargeError, errors.RecordListTooLargeError)):
        fix = ("the record is larger than the producer's max_request_size or the topic's "
               "max.message.bytes: raise them (--producer-config max_request_size=N, topic "
               "config max.message.bytes)")
    elif isinstance(error, (errors.TopicAuthorizationFailedError,
                            errors.ClusterAuthorizationFailedError)):
        fix = "grant this client's principal WRITE on the topic"
    elif isinstance(error, errors.UnknownTopicOrPartitionError):
        fix = "create the topic, or let the worker create it (--create-topics)"
    elif isinstance(error, errors.KafkaTimeoutError):
        fix = ("the broker did not take it in time: check that it is reachable "
               "(--bootstrap-servers, security settings) and that the topic exists")
    else:
        fix = "check the broker, the topic and the producer settings (--producer-config)"
    return WorkerError(
        f"producing {what} failed: {type(error).__name__}: {str(error)[:300]}. Fix: {fix}. "
        "Nothing was committed: a restart replays from the last checkpoint"
    )


def _transaction_failure(error: BaseException, producer: dict) -> WorkerError:
    """The error to stop with when the transactional producer cannot go on."""
    from kafka import errors

    transactional_id = producer.get("transactional_id")
    if isinstance(error, (errors.ProducerFencedError, errors.InvalidProducerEpochError)):
        fix = (f"another producer with transactional_id {transactional_id!r} started: give each "
               "worker its own --client-id (the transactional id is <group id>-<client id>)")
    elif isinstance(error, (errors.TransactionalIdAuthorizationFailedError,
                            errors.ClusterAuthorizationFailedError)):
        fix = (f"grant this client's principal WRITE and DESCRIBE on transactional id "
               f"{transactional_id!r}")
    else:
        fix = "check the broker (transactions need Kafka 2.5+) and --producer-config"
    return WorkerError(
        f"the exactly-once transaction failed: {type(error).__name__}: {str(error)[:300]}. "
        f"Fix: {fix}. Nothing of the open transaction was committed: a restart goes on from "
        "the last committed one"
    )


def _connect_failure(servers: str, client: str, settings: dict, error: BaseException,
                     last_error: str | None) -> WorkerError:
    """The error to stop with when a client cannot reach the brokers: which servers, for how
    long, the last connection error, and what to check."""
    from kafka import KafkaProducer, errors

    if isinstance(error, errors.KafkaTimeoutError):
        timeout_ms = settings.get("bootstrap_timeout_ms",
                                  KafkaProducer.DEFAULT_CONFIG["bootstrap_timeout_ms"])
        cause = (f"no broker answered within {timeout_ms / 1000:g} s (the {client}'s "
                 f"bootstrap_timeout_ms={timeout_ms})")
        if last_error:
            cause += f"; last error: {last_error}"
    else:
        cause = f"{type(error).__name__}: {str(error)[:200]}"
    return WorkerError(
        f"cannot connect to the Kafka brokers at {servers}: {cause}. Fix: check "
        "--bootstrap-servers (host:port of a broker listener), that the brokers are up and "
        "reachable from this host, and the security settings that listener expects "
        "(--security-protocol, --ssl-*, --sasl-*)"
    )
