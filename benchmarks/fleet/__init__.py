"""The provisioning half at fleet size: site.yml over ~100 SIMULATED light hosts (bench.py)."""
