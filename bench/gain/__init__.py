"""What augmentation gains a few-shot classifier, and the generator it depends on (TensorFlow)."""
