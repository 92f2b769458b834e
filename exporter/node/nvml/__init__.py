"""The NVML backend: reads every GPU through NVML (pynvml) into a NodeSample.

Modules, each testable alone:

* ``errors``: error accounting: each NVML call wrapped on its own (``CallErrors``), error counts,
  ``error_name``, ``capped_backoff``; NotSupported, FunctionNotFound and GPU_IS_LOST handling.
* ``identity``: what a GPU or MIG handle says about itself, MIG mode and MIG enumeration.
* ``fields``: per-field reads: memory, utilization, power, temperature, clocks, ECC, clocks event
  reasons, running processes and per-process utilization samples.
* ``health``: a card's health signals: energy, power limit, fan, P-state, memory temperature, PCIe,
  retired pages, row remapping and NVLink per link.
* ``gpm``: GPM profiling ratios (Hopper and newer) and the sample buffers they need.
* ``backend``: ``NvmlBackend``: init/shutdown with backoff, lost devices, ``sample()``.

The rules are in each module's docstring (facts in the NVML reference notes).
"""
