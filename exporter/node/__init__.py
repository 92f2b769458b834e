"""The node pipeline: the sources one cycle samples (NVML or the simulated node, /proc, pods,
kubelet pod-resources) and the sampling loop that carries a sample through attribution to a snapshot."""
