"""Downstream evaluation: fine-tune a pretrained checkpoint on a labelled task and score it.

tasks.py loads and checks a task (built-in, GLUE, files), metrics.py scores predictions,
finetune.py trains one (seed, learning rate) trial with TensorFlow, sweep.py runs the grid of
trials as Ray tasks and records them in the run's metrics.jsonl (`kind: downstream`).
"""
