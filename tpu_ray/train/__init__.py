"""Training with TensorFlow: tf.data inputs -> strategy -> model -> loop, checkpoints, metrics, export."""
