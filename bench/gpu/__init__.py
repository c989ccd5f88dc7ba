"""Full-size SDXL on a GPU machine, and the plumbing to run it there (gpu_run.sh, and the
wheels an offline GPU box lacks)."""
