"""The training recipe in one line: every lever a run trained with, as the model card and
the report show it, read from the run's config so the two cannot disagree with what ran."""

from __future__ import annotations

from tpu_ray.config import ModelConfig, TrainConfig
from tpu_ray.train.curves import describe


def recipe_text(t: TrainConfig, m: ModelConfig) -> str:
    """Peak rate and schedule, masking (the train section), and how a fresh model started (the model
    section: its output bias and weight scale; a run from trained weights says so instead, as those
    levers do not apply to it)."""
    masking = f"{t.mask_prob:.0%} masked ({'an exact count per sequence' if t.mask_count == 'exact' else 'a random count'})"
    if m.init_from or t.branch_from:
        start = "weights from " + ("model.init_from" if m.init_from else "train.branch_from")
    else:
        scale = f"{m.initializer_range:g}" if m.initializer_range is not None else "the type's default"
        start = f"output bias {m.output_bias}, initializer_range {scale}"
    return f"peak learning rate {t.learning_rate:g}, {describe(t)}; {masking}; {start}"
