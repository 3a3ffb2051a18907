"""Harness of the channel benchmarks: payloads, transports, measurement (see ../README.md)."""
