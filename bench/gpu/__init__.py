"""Full-size SDXL on a GPU, and the plumbing for a lent GPU machine (wheels, gpu_run.sh)."""
