"""The pool: sample latency, fill rates, need-driven filling, replicas on one PostgreSQL pool."""
