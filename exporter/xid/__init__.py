"""NVIDIA Xid errors: the kernel log and NVML event sources, report parsing, deduplication,
counters and Kubernetes Events."""
