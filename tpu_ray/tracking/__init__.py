"""Experiment tracking: the run's records also go to MLflow (`tracking.mlflow.uri`) and Weights &
Biases (`tracking.wandb.project`): the config as parameters, every train, eval and downstream
record as metrics at its step, the model card and the report with its plots as artifacts.

Each tracker is a mirror of the metrics stream (tpu_ray.metrics_stream.Mirror): it receives every
record the run writes, so neither the trainer's loop nor fine-tuning calls a tracker themselves.

Why the libraries' own clients and not Ray's `ray.air.integrations.mlflow` / `.wandb`: those
serve Ray Tune and Ray Train. `MLflowLoggerCallback` and `WandbLoggerCallback` are Tune callbacks
fed by `train.report()`; our trainer is a custom TensorFlow loop in a Ray task on a TPU host, which
reports nothing to a Tune session. `setup_mlflow` / `setup_wandb` only wrap `mlflow.start_run` /
`wandb.init` (with Ray Train's rank to keep non-zero workers quiet, which our writers already are:
only the chief writes records). Calling `MlflowClient` with an explicit run id and `wandb.init`
directly lets the trainer, a resumed trainer and `tpu-ray finetune` (other processes, other
times) continue one tracked run, with our own failure policy (tpu_ray/tracking/base.py).
"""
