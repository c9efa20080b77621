"""The MLM head on gathered positions, for every family (tpu_ray.families names the layers).

Why: a TF*ForMaskedLM call projects every position onto the vocabulary; the trainer needs only
the ~15% masked ones. Each family's head is a short chain of the model's own layers (RoBERTa's
`lm_head`, BERT's `mlm`, ELECTRA's `generator_predictions` then `generator_lm_head`, ...), so
the encoder's hidden states are gathered first and the chain applied to them: same layers, same
weights, and the exported model is the ordinary TF*ForMaskedLM. A family without a head chain
(`head=None`) runs the whole model and gathers its logits: correct, just not cheaper.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tpu_ray.families import family


def gathered_logits(model: Any, batch: dict[str, tf.Tensor], training: bool) -> tf.Tensor:
    """Vocabulary logits at `batch["mlm_positions"]` only: [batch, k, vocab]."""
    fam = family(model.config.model_type)
    positions = batch["mlm_positions"]
    if fam.head is None:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=training).logits
        return tf.gather(logits, positions, batch_dims=1)
    encoder = getattr(model, model.base_model_prefix)
    hidden = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=training)[0]
    out = tf.gather(hidden, positions, batch_dims=1)
    for name in fam.head:  # heads have no dropout: called as the model's own call() calls them
        out = getattr(model, name)(out)
    return out
