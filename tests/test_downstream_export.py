"""Token classification trained end to end (one tiny trial, no Ray) and the fine-tuned model's export:
entity-level F1 reported, and the saved model loaded by TFAutoModelForTokenClassification with its
label names, and from model.safetensors by PyTorch Transformers (where the interop venv is built,
tests/interop/setup_venvs.sh; TPU_RAY_INTEROP_VENVS names another checkout's)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO, save_tiny_roberta
from tpu_ray.downstream.tasks import Task

pytestmark = pytest.mark.slow
VENVS = Path(os.environ.get("TPU_RAY_INTEROP_VENVS", REPO / ".venv-interop"))
NAMES, VERBS = ["anna", "bob", "carl", "dora"], ["lives", "works", "sleeps"]
CITIES = ["paris", "new york", "rome", "oslo"]
SPECIAL = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def _sentence(name: str, verb: str, city: str) -> dict:
    city_words = city.split()
    return {"text": [name, verb, "in", *city_words],
            "label": ["B-PER", "O", "O", "B-LOC", *["I-LOC"] * (len(city_words) - 1)]}


@pytest.fixture(scope="module")
def ner_task() -> Task:
    """Who lives where: 48 sentences, names B-PER, cities B-LOC/I-LOC; every fifth held out for validation."""
    rows = [_sentence(*c) for c in itertools.product(NAMES, VERBS, CITIES)]
    names = ["B-LOC", "B-PER", "I-LOC", "O"]
    recs = [{"text": r["text"], "label": [names.index(t) for t in r["label"]]} for r in rows]
    splits = {"train": [r for i, r in enumerate(recs) if i % 5], "validation": recs[::5]}
    return Task(name="who-lives-where", kind="tokens", splits=splits, label_names=names,
                metrics=["entity_f1", "token_accuracy"])


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny RoBERTa (hidden 32, one layer) over a WordPiece vocabulary with 'york' split in two."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = [*SPECIAL, "in", "new", "yo", "##rk", *NAMES, *VERBS, *[c for c in CITIES if " " not in c]]
    t = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>", mask_token="<mask>")
    return save_tiny_roberta(tok, tmp_path_factory.mktemp("tiny") / "model", max_positions=18)


@pytest.fixture(scope="module")
def trial(tiny_model_dir, ner_task, tmp_path_factory):
    from tpu_ray.downstream.finetune import FinetuneSpec, finetune_trial

    spec = FinetuneSpec(epochs=8, batch_size=8, max_length=16, warmup_ratio=0.0, learning_rates=[3e-3])
    export = tmp_path_factory.mktemp("ft") / "export"
    return finetune_trial(tiny_model_dir, ner_task, seed=0, learning_rate=3e-3, spec=spec, save_to=str(export)), export


def test_token_classification_trains_and_reports_entity_f1(trial, ner_task):
    result, _ = trial
    scores = result["scores"]["validation"]
    assert set(scores) == {"entity_f1", "token_accuracy"}
    assert result["train_examples"] == 8 * len(ner_task.splits["train"])
    # 10 held-out sentences of 2 entities each; a model that tags every word O scores entity F1 0.
    assert scores["entity_f1"] > 0.5, result
    assert scores["token_accuracy"] > 0.6, result
    assert len(result["validation_by_epoch"]) == 8 and 1 <= result["best_epoch"] <= 8
    assert scores["entity_f1"] == max(result["validation_by_epoch"])  # the best epoch's, chosen on validation


def test_the_recorded_entity_f1_is_a_hand_count_of_the_exported_models_predictions(trial, ner_task):
    """The exported model is the best epoch's: its predictions on validation, mapped to tag names here
    and counted entity by entity (type and span equal, CoNLL's chunking), give the entity F1 the
    trial reported."""
    result, export = trial
    gold_entities, pred_entities = set(), set()
    for i, row in enumerate(ner_task.splits["validation"]):
        ids, logits, id2label = _logits_tf(export, row["text"])
        from transformers import AutoTokenizer

        word_ids = AutoTokenizer.from_pretrained(str(export))(row["text"], is_split_into_words=True).word_ids()
        first = {}
        for pos, w in enumerate(word_ids):
            if w is not None and w not in first:
                first[w] = id2label[int(logits[pos].argmax())]
        pred = [first.get(w, "O") for w in range(len(row["text"]))]
        gold = [ner_task.label_names[t] for t in row["label"]]
        for tags, into in ((gold, gold_entities), (pred, pred_entities)):
            # CoNLL's chunks: one starts at B-X, or at I-X after O or another type; it ends before B-, O
            # or another type
            start, kind = None, None
            for j, tag in enumerate([*tags, "O"]):
                prefix, typ = (tag[0], tag[2:]) if tag != "O" else ("O", None)
                if start is not None and (prefix in ("B", "O") or typ != kind):
                    into.add((i, start, j, kind))
                    start = None
                if prefix == "B" or (prefix == "I" and start is None):
                    start, kind = j, typ
    hits = len(gold_entities & pred_entities)
    f1 = 2 * hits / (len(gold_entities) + len(pred_entities)) if hits else 0.0
    assert result["scores"]["validation"]["entity_f1"] == pytest.approx(f1)


def _logits_tf(export: Path, words: list[str]) -> tuple[list[int], np.ndarray, dict]:
    from transformers import AutoTokenizer, TFAutoModelForTokenClassification

    # tf_model.h5: Transformers 4.57's TF loading of a safetensors file is broken (#40028, docs/models.md)
    model = TFAutoModelForTokenClassification.from_pretrained(str(export), use_safetensors=False)
    enc = AutoTokenizer.from_pretrained(str(export))(words, is_split_into_words=True, return_tensors="np")
    return enc["input_ids"][0].tolist(), model(**enc).logits.numpy()[0], model.config.id2label


def test_the_fine_tuned_model_loads_in_tensorflow_with_its_label_names(trial, ner_task):
    _, export = trial
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["RobertaForTokenClassification"]
    assert config["label2id"] == {n: i for i, n in enumerate(ner_task.label_names)}
    assert {"tf_model.h5", "model.safetensors", "tokenizer.json"} <= set(os.listdir(export))
    ids, logits, id2label = _logits_tf(export, ["bob", "works", "in", "new", "york"])
    assert list(id2label.values()) == ner_task.label_names
    assert logits.shape == (len(ids), len(ner_task.label_names))
    tags = [id2label[int(i)] for i in logits.argmax(-1)]
    assert tags[1] == "B-PER", tags  # after <s>: bob, a name in every training sentence's first word


def pytorch_logits(auto_class: str, export: Path, ids: list[int]) -> dict:
    """id2label and logits of `export` loaded by PyTorch Transformers 5 from model.safetensors (the interop
    venv, without TensorFlow); a skip where the venv is not built (a failure under TPU_RAY_REQUIRE_EXTRAS=1)."""
    python = VENVS / "t5" / "bin" / "python"
    if not python.exists():
        why = f"PyTorch interop venv {VENVS / 't5'} absent: build it with tests/interop/setup_venvs.sh"
        if os.environ.get("TPU_RAY_REQUIRE_EXTRAS"):
            pytest.fail(why)
        pytest.skip(why)
    script = (f"import json, sys, torch\nfrom transformers import {auto_class} as A\n"
              "m = A.from_pretrained(sys.argv[1]).eval()\n"
              "with torch.no_grad(): out = m(torch.tensor([json.loads(sys.argv[2])])).logits[0]\n"
              "print(json.dumps({'id2label': {str(k): v for k, v in m.config.id2label.items()}, "
              "'logits': out.tolist()}))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_NO_TF="1")
    done = subprocess.run([str(python), "-c", script, str(export), json.dumps(ids)], capture_output=True, text=True,
                          env=env, cwd="/", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_fine_tuned_model_loads_in_pytorch_from_safetensors(trial):
    _, export = trial
    ids, logits, id2label = _logits_tf(export, ["bob", "works", "in", "new", "york"])
    answer = pytorch_logits("AutoModelForTokenClassification", export, ids)
    assert answer["id2label"] == {str(k): v for k, v in id2label.items()}
    np.testing.assert_allclose(np.asarray(answer["logits"]), logits, atol=1e-4)
