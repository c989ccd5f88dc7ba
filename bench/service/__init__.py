"""The service under load: throughput, batching, guidance, the wire, fairness, revisions."""
