"""What a model family is, in one place: every stage reads this registry.

A family entry says, for one transformers `model_type` that TensorFlow can train as a masked LM:
its conventional special tokens (and the id order a tokenizer tpu-ray trains gives them), the id
the model requires for padding (TF RoBERTa-like models hard-code padding_idx=1 in their position
ids), where its position ids start, its published config defaults, the config field names of the
sizes and dropout, and the attribute path of its MLM head (so the trainer can project only the
gathered masked positions). Adding a family is one entry here plus its row in the test matrix.

Why not read all of this from transformers: the token conventions live in each tokenizer class
(often a slow SentencePiece one), padding_idx=1 is a constant inside the TF model code, and the
head's layer names differ per model; transformers has no table of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from tpu_ray.errors import UserError


@dataclass(frozen=True)
class SpecialTokens:
    """The five tokens masked-LM training needs, by role."""

    cls: str
    pad: str
    sep: str
    unk: str
    mask: str

    def by_role(self) -> dict[str, str]:
        return {"cls": self.cls, "pad": self.pad, "sep": self.sep, "unk": self.unk, "mask": self.mask}

    def as_tuple(self) -> tuple[str, ...]:
        return (self.cls, self.pad, self.sep, self.unk, self.mask)


# tpu-ray's mixed set, used by every tokenizer tpu-ray trained before families existed (and
# ALBERT's own convention); kept so old runs load and train.
TPU_RAY_MIXED = SpecialTokens("[CLS]", "<pad>", "[SEP]", "<unk>", "[MASK]")
ROBERTA_TOKENS = SpecialTokens("<s>", "<pad>", "</s>", "<unk>", "<mask>")
BERT_TOKENS = SpecialTokens("[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]")
FUNNEL_TOKENS = SpecialTokens("<cls>", "<pad>", "<sep>", "<unk>", "<mask>")
MPNET_TOKENS = SpecialTokens("<s>", "<pad>", "</s>", "[UNK]", "<mask>")
XLM_TOKENS = SpecialTokens("<s>", "<pad>", "</s>", "<unk>", "<special1>")

# Every convention a tokenizer may follow, tried in this order when a tokenizer's roles are not
# written down (tokenizer.json alone): the mixed set first, so an old run reads as before.
CONVENTIONS: tuple[SpecialTokens, ...] = (TPU_RAY_MIXED, ROBERTA_TOKENS, BERT_TOKENS, MPNET_TOKENS,
                                         FUNNEL_TOKENS, XLM_TOKENS)

_BERT_ORDER = ("pad", "unk", "cls", "sep", "mask")  # bert-base: [PAD]=0, then [UNK] [CLS] [SEP] [MASK]
_ROBERTA_ORDER = ("cls", "pad", "sep", "unk", "mask")  # roberta-base: <s>=0 <pad>=1 </s>=2 <unk>=3


@dataclass(frozen=True)
class Family:
    """One trainable masked-LM model type (see the module docstring)."""

    model_type: str
    tokens: SpecialTokens
    # The role order a tokenizer trained here gives ids 0..4 (e.g. RoBERTa's <pad> at 1).
    id_order: tuple[str, ...]
    # The pad id the TF model hard-codes (its position ids treat this id as padding), or None.
    required_pad_id: int | None = None
    # Position ids start here: padding_idx + 1 for RoBERTa-like models, 0 otherwise.
    position_offset: int = 0
    # Config defaults of the published checkpoint, applied to models built from scratch.
    published: dict[str, Any] = field(default_factory=dict)
    # Our size names -> this config's field names where they differ (None: the type has no such field).
    size_fields: dict[str, str | None] = field(default_factory=dict)
    dropout_fields: tuple[str, ...] = ("hidden_dropout_prob", "attention_probs_dropout_prob")
    # Layers applied to the encoder's hidden states to get vocabulary logits, as attribute paths
    # of the TF*ForMaskedLM model; None: call the whole model and gather (every position projected).
    head: tuple[str, ...] | None = None
    # Extra config values for a model built from scratch (e.g. switch off features that need inputs
    # other than token ids).
    scratch_extra: dict[str, Any] = field(default_factory=dict)
    # PyTorch weights whose shape differs from the transposed TF one (the export reshapes them):
    # (substring of the PyTorch name, "in1k" for a depthwise Conv1d [in, 1, k] | "column" for [n, 1]).
    pt_reshapes: tuple[tuple[str, str], ...] = ()
    # Weights TF keeps as their own variables but PyTorch ties to another and drops when it saves
    # (measured with torch save_pretrained, transformers 4.57 and 5): (dropped PyTorch name, the
    # PyTorch name it equals). Continuing from a PyTorch-written model.safetensors fills them in.
    pt_tied: tuple[tuple[str, str], ...] = ()
    note: str = ""
    # Why this type cannot train in mixed precision ("" when it can): checked against the precision
    # the strategy resolves (auto included), so the run stops with one line before building the model.
    float32_only: str = ""
    # Why the PyTorch-layout export computes differently from the TF model ("" when it does not):
    # the export still writes it (init_from reads it back exactly) but says so in its log and card.
    pytorch_differs: str = ""
    # Why this type's TF code needs autograph (Python control flow on tensors inside transformers),
    # "" when it does not: the trainer then calls the model unconverted (train/loop.mlm_logits).
    autograph: str = ""

    @property
    def pad_role_id(self) -> int:
        """The pad id a tokenizer trained for this family gets."""
        return self.id_order.index("pad")


_ROBERTA_PUBLISHED = dict(max_position_embeddings=514, layer_norm_eps=1e-5, type_vocab_size=1)


def _roberta_like(model_type: str, head: tuple[str, ...] = ("lm_head",), **kw: Any) -> Family:
    kw.setdefault("published", _ROBERTA_PUBLISHED)
    kw.setdefault("tokens", ROBERTA_TOKENS)
    return Family(model_type, id_order=_ROBERTA_ORDER, required_pad_id=1, position_offset=2, head=head, **kw)


def _bert_like(model_type: str, head: tuple[str, ...] | None, **kw: Any) -> Family:
    kw.setdefault("published", dict(max_position_embeddings=512, layer_norm_eps=1e-12, type_vocab_size=2))
    kw.setdefault("tokens", BERT_TOKENS)
    return Family(model_type, id_order=_BERT_ORDER, head=head, **kw)


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    _roberta_like("roberta"),
    _roberta_like("xlm-roberta"),
    _roberta_like("camembert"),
    _roberta_like("roberta-prelayernorm"),
    _roberta_like("longformer", published=dict(_ROBERTA_PUBLISHED, max_position_embeddings=4098),
                  note="attention_window is set to the sequence length from scratch",
                  float32_only="TF Longformer's global attention does tf.where(mask, -10000.0, scores) on "
                               "half-precision scores, a TypeError inside transformers 4.57",
                  autograph="TF Longformer's attention branches in Python on tensors (is_global_attn)"),
    _roberta_like("mpnet", tokens=MPNET_TOKENS, published=dict(max_position_embeddings=514, layer_norm_eps=1e-5),
                  dropout_fields=("hidden_dropout_prob", "attention_probs_dropout_prob")),
    _bert_like("bert", ("mlm",)),
    _bert_like("electra", ("generator_predictions", "generator_lm_head")),
    _bert_like("convbert", ("generator_predictions", "generator_lm_head"),
               pt_reshapes=(("depthwise.weight", "in1k"), ("conv_attn_layer.bias", "column"))),
    _bert_like("mobilebert", ("predictions",), size_fields={"intermediate_size": "intermediate_size"},
               pt_tied=(("cls.predictions.decoder.weight", "mobilebert.embeddings.word_embeddings.weight"),),
               note="embedding and bottleneck sizes follow hidden_size from scratch"),
    _bert_like("rembert", ("mlm",)),
    _bert_like("roformer", ("mlm",), published=dict(max_position_embeddings=1536, layer_norm_eps=1e-12,
                                                    type_vocab_size=2)),
    _bert_like("deberta", ("mlm",), published=dict(max_position_embeddings=512, layer_norm_eps=1e-7,
                                                   type_vocab_size=0),
               autograph="TF DeBERTa's relative attention (every published checkpoint's) branches in Python on "
                         "tf.rank (torch_gather)"),
    _bert_like("deberta-v2", ("mlm",), published=dict(max_position_embeddings=512, layer_norm_eps=1e-7,
                                                      type_vocab_size=0)),
    _bert_like("distilbert", ("vocab_transform", "act", "vocab_layer_norm", "vocab_projector"),
               published=dict(max_position_embeddings=512),
               size_fields={"intermediate_size": "hidden_dim"}, dropout_fields=("dropout", "attention_dropout")),
    Family("albert", TPU_RAY_MIXED, id_order=("pad", "unk", "cls", "sep", "mask"), head=("predictions",),
           pt_tied=(("predictions.decoder.bias", "predictions.bias"),),
           published=dict(max_position_embeddings=512, layer_norm_eps=1e-12, type_vocab_size=2)),
    Family("funnel", FUNNEL_TOKENS, id_order=_ROBERTA_ORDER, head=("lm_head",),
           published=dict(max_position_embeddings=512, layer_norm_eps=1e-9, type_vocab_size=3),
           size_fields={"num_hidden_layers": None, "intermediate_size": "d_inner"},
           dropout_fields=("hidden_dropout", "attention_dropout", "activation_dropout"),
           note="layers come as block_sizes (one layer per block from scratch)",
           pytorch_differs="PyTorch Funnel computes other logits than TF Funnel from the same weights "
                           "(measured: up to 7 apart, every weight loaded); use the TF weights (tf_model.h5)"),
    Family("xlm", XLM_TOKENS, id_order=("cls", "sep", "pad", "unk", "mask"), head=None,
           published=dict(max_position_embeddings=512), size_fields={"intermediate_size": None},
           dropout_fields=("dropout", "attention_dropout")),
    Family("flaubert", XLM_TOKENS, id_order=("cls", "sep", "pad", "unk", "mask"), head=None,
           published=dict(max_position_embeddings=512), size_fields={"intermediate_size": None},
           dropout_fields=("dropout", "attention_dropout")),
)}

# TF masked-LM types of transformers 4.57 that tpu-ray does not train, and why.
EXCLUDED: dict[str, str] = {
    "layoutlm": "needs word bounding boxes (bbox) from a document layout, not token ids alone",
    "tapas": "needs table structure (7 token-type ids per token: row, column, rank...), not token ids alone",
    "esm": ("is a protein model whose TF MLM head keeps a second, untied copy of the word embeddings under the "
            "embeddings' own name (PyTorch ties them), so its trained weights cannot be exported faithfully"),
}


def family(model_type: str, where: str = "model.model_type") -> Family:
    """The registry entry of `model_type`, or a one-line error naming the supported ones."""
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    if model_type in EXCLUDED:
        raise UserError(f"{where}={model_type}: not supported, it {EXCLUDED[model_type]}; "
                        f"use one of {', '.join(sorted(FAMILIES))}")
    raise UserError(f"{where}={model_type}: not a TensorFlow masked-LM type tpu-ray trains; "
                    f"use one of {', '.join(sorted(FAMILIES))}")


def mixed_precision_refusal(model_type: str, precision: str) -> str | None:
    """The one line refusing `precision` for a type that trains in float32 only (None: it can)."""
    fam = FAMILIES.get(model_type)
    if fam is None or not fam.float32_only or precision == "float32":
        return None
    return (f"model.model_type={model_type} cannot train in {precision}: {fam.float32_only}; "
            f"set train.mixed_precision=float32")


def training_order(fam: Family) -> list[str]:
    """The special tokens in the id order a tokenizer trained for `fam` gives them (ids 0..4)."""
    roles = fam.tokens.by_role()
    return [roles[r] for r in fam.id_order]


def positions_needed(fam: Family, seq_len: int) -> int:
    return seq_len + fam.position_offset
