"""`tpu-ray doctor`: check a config, its data and its model on CPU before an accelerator is used."""
