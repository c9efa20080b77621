"""Token classification tasks (quick: no training, no Ray): records of words and per-word labels read
from files with the `datasets` NER field names or the config's own, labels aligned to subword tokens
(first subword labelled, the rest -100) and read back per word, and every refusal of a bad token
task (one line, exit 2, before anything runs)."""

from __future__ import annotations

import json

import pytest

from tests.test_downstream_tasks import assert_refused_before_anything_runs
from tpu_ray.cli import main
from tpu_ray.downstream.tasks import load_task
from tpu_ray.downstream.tokens import IGNORE, align_labels, encode_words, outside_label, word_predictions

pytestmark = pytest.mark.quick
SUBWORDS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "ann", "##a", "lives", "in", "new", "york", "##er", "paris"]


def wordpiece_tokenizer():
    """A fast WordPiece tokenizer over a fixed vocabulary, so each word's subwords are known here."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordPiece({w: i for i, w in enumerate(SUBWORDS)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", mask_token="<mask>")


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _ner(n: int = 2):
    rows = [{"tokens": ["anna", "lives", "in", "new", "york"], "tags": ["B-PER", "O", "O", "B-LOC", "I-LOC"]},
            {"tokens": ["paris", "lives"], "tags": ["B-LOC", "O"]}]
    return rows[:n]


def test_token_task_reads_tokens_and_tags_by_default(tmp_path):
    _jsonl(tmp_path / "train.jsonl", _ner())
    _jsonl(tmp_path / "validation.jsonl", _ner(1))
    task = load_task(str(tmp_path))
    assert task.kind == "tokens" and task.metrics == ["entity_f1", "token_accuracy"]
    assert task.label_names == ["B-LOC", "B-PER", "I-LOC", "O"]
    assert task.splits["validation"] == [{"text": ["anna", "lives", "in", "new", "york"], "label": [1, 3, 3, 0, 2]}]
    assert task.chance() is None and "tokens, 4 classes" in task.describe()


def test_token_task_fields_and_integer_label_names_from_the_task_yaml(tmp_path):
    rows = [{"words": ["new", "york"], "ner": [1, 2]}, {"words": ["in"], "ner": [0]}]
    _jsonl(tmp_path / "a.jsonl", rows)
    _jsonl(tmp_path / "b.jsonl", rows[:1])
    (tmp_path / "ner.yaml").write_text("train: a.jsonl\nvalidation: b.jsonl\nkind: tokens\ntext_field: words\n"
                                       "label_field: ner\nlabel_names: [O, B-LOC, I-LOC]\n")
    task = load_task(str(tmp_path / "ner.yaml"))
    assert task.kind == "tokens" and task.label_names == ["O", "B-LOC", "I-LOC"]
    assert task.splits["train"][0] == {"text": ["new", "york"], "label": [1, 2]}
    # A text field that holds words makes a token task without `kind:`; its labels default to `tags`.
    (tmp_path / "w.yaml").write_text("train: c.jsonl\nvalidation: d.jsonl\ntext_field: words\n")
    _jsonl(tmp_path / "d.jsonl", [{"words": ["old", "york"], "tags": ["B-LOC", "I-LOC"]}, {"words": ["at"], "tags": ["O"]}])
    _jsonl(tmp_path / "c.jsonl", [{"words": ["new", "york"], "tags": ["B-LOC", "I-LOC"]},
                                  {"words": ["in"], "tags": ["O"]}])
    assert load_task(str(tmp_path / "w.yaml")).splits["train"][0] == {"text": ["new", "york"], "label": [0, 1]}


def test_token_task_keeps_the_class_names_of_a_saved_ner_dataset(tmp_path):
    import datasets

    feats = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                               "tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-PER", "I-PER"]))})
    data = {"tokens": [["anna", "lives"], ["in", "paris"]], "tags": [[1, 0], [0, 0]]}
    held_out = {"tokens": [["bob", "runs"], ["to", "rome"]], "tags": [[1, 0], [0, 0]]}
    datasets.DatasetDict({s: datasets.Dataset.from_dict(d, features=feats) for s, d in (("train", data),
                                                                                      ("validation", held_out))}
                         ).save_to_disk(str(tmp_path / "ner"))
    task = load_task(str(tmp_path / "ner"))
    assert task.kind == "tokens" and task.label_names == ["O", "B-PER", "I-PER"]
    assert task.splits["validation"][0]["label"] == [1, 0]


def test_labels_align_to_the_first_subword_and_predictions_read_back_per_word():
    tok = wordpiece_tokenizer()
    rows = [{"text": ["anna", "lives", "in", "new", "yorker"], "label": [1, 0, 0, 2, 3]}]
    x, y, word_ids = encode_words(tok, rows, max_length=10, type_vocab=1)
    pieces = tok.convert_ids_to_tokens(x["input_ids"][0].tolist())
    assert pieces[:9] == ["<s>", "ann", "##a", "lives", "in", "new", "york", "##er", "</s>"]
    assert y[0].tolist() == [IGNORE, 1, IGNORE, 0, 0, 2, 3, IGNORE, IGNORE, IGNORE]
    assert x["attention_mask"][0].tolist() == [1] * 9 + [0]
    # The prediction of each word is its first subword's; a later subword's never counts.
    preds = [9, 1, 7, 0, 0, 2, 3, 7, 9, 9]
    assert word_predictions(word_ids[0], preds, 5, fill=0) == [1, 0, 0, 2, 3]
    # Truncated: the words cut away get the outside label, so they are scored as missed, not dropped.
    _, y_cut, ids_cut = encode_words(tok, rows, max_length=5, type_vocab=1)
    assert y_cut[0].tolist() == [IGNORE, 1, IGNORE, 0, IGNORE]
    assert word_predictions(ids_cut[0], [0, 1, 1, 0, 0], 5, fill=3) == [1, 0, 3, 3, 3]
    assert align_labels([None, 0, 0, None], [4]) == [IGNORE, 4, IGNORE, IGNORE]
    assert outside_label(["B-LOC", "O"]) == 1 and outside_label(["x", "y"]) == 0


BAD = {
    "missing tags field": ([{"tokens": ["a", "b"], "ner": ["O", "B-X"]}], _ner(1), "no field 'tags'"),
    "lengths differ": ([*_ner(), {"tokens": ["a", "b", "c"], "tags": ["O", "O"]}], _ner(1),
                       "row 3: 'tags' has 2 labels for 3 words"),
    "unseen validation label": (_ner(), [{"tokens": ["anna"], "tags": ["B-ORG"]}],
                                "'B-ORG', a label the train split never had"),
    "one class": ([{"tokens": ["a", "b"], "tags": ["O", "O"]}], [{"tokens": ["c"], "tags": ["O"]}],
                  "one class only ('O')"),
    "not words": ([*_ner(), {"tokens": ["a", 3], "tags": ["O", "O"]}], _ner(1), "row 3: field 'tokens'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_token_task_is_one_line_and_exit_2_before_anything_runs(case, tmp_path, capsys):
    assert_refused_before_anything_runs(*BAD[case], tmp_path, capsys)


def test_token_task_on_a_model_without_a_fast_tokenizer_is_refused_before_ray(tmp_path, capsys):
    _jsonl(tmp_path / "train.jsonl", _ner())
    _jsonl(tmp_path / "validation.jsonl", [{**r, "tokens": ["held", *r["tokens"][1:]]} for r in _ner(1)])
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # no tokenizer beside it
    rc = main(["finetune", str(model), "--task", str(tmp_path), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "no tokenizer loads from it" in err, err
    assert not (tmp_path / "out").exists()


def test_token_task_records_show_entity_f1_in_metrics_and_report(tmp_path, capsys):
    """Records of a token task, written by the sweep's own writer: `tpu-ray metrics` shows the entity F1
    column and the report's line is its mean ± sd over seeds."""
    from tpu_ray.downstream.sweep import Summary, Trial, record

    trials = [Trial(seed=s, learning_rate=3e-3, result={"scores": {"validation": {"entity_f1": f, "token_accuracy": 0.9}},
                                                         "train_examples": 38, "examples_per_s": 10.0,
                                                         "final_loss": 0.1, "best_epoch": 2, "truncated_share": 0.0,
                                                         "max_length": 128}) for s, f in enumerate([0.5, 0.7])]
    record(str(tmp_path), Summary(task="ner", task_hash="h", step=None, trials=trials, metric="entity_f1",
                                  chance=None))
    capsys.readouterr()
    assert main(["metrics", str(tmp_path), "--kind", "downstream"]) == 0
    table = capsys.readouterr().out
    assert "entity_f1" in table and "0.700" in table and "token_acc" in table, table
    assert main(["report", str(tmp_path)]) == 0
    assert "ner: validation entity_f1 0.6000 ± 0.1414 (2 seeds, lr 0.003; on validation" in capsys.readouterr().out
