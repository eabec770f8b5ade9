"""Tools for developing and measuring the service, shared by the tests and the benchmarks (neither imports the
other): a real S3-compatible server on loopback and a client for it."""
