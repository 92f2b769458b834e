"""Benchmarks: bench/run.py (one node, ours vs nvitop-exporter) and the fleet benchmark (fleet*, rule_cost)."""
