"""streammargin connectors: Kafka consumer processes and the command line around the models."""
