"""What the trainer side costs: step time with mixing and a feeder, diagnosis (TensorFlow)."""
