"""Benchmarks of the service's throughput-critical paths against baselines measured in the same run."""
