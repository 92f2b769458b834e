"""Attribution: which container uses which GPU (cgroup parsing), what each sharing scheme
allocated, and ``allocate_mode``. Pure functions only."""
