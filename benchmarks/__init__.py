"""Benchmark scripts and the harness behind ``inflight bench``."""
