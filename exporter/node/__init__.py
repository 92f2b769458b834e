"""The node's sources, each keeping its own last good answer: NVML or the simulated node, /proc, pods,
the kubelet's pod-resources, the Node object and DRA objects. Nothing here imports the exposition."""
