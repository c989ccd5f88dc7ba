"""What the trainer side costs: step time with mixing, diagnosis (TensorFlow, PyTorch)."""
