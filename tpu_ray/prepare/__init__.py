"""Data preparation on CPU: corpus -> tokenizer -> TFRecord shards (no TensorFlow needed)."""
