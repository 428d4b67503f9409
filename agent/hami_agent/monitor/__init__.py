"""``hami-agent monitor``: per-container vGPU metrics from HAMi-core shared regions (HAMi metric names)."""
