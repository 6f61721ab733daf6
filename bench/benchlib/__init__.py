"""Benchmark harness for the exactly broker (see bench/README.md)."""
