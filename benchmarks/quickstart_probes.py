"""How many sentences of the built-in corpus's kind does a model answer from context?

The quickstart trains on CPython's documentation; one example sentence (README) says little about
what the model learned. These probes are statements of the kinds that corpus makes (version notes,
return values, arguments, exceptions, files, modules), each with the answers that fit its context.
A probe counts as answered from context when the model's first prediction is one of its answers;
a frequency-only model answers `the`, `a`, `is` to all of them. Answers are whole words that the
tokenizer must hold as one token: a probe whose answers are all split is reported, not counted.

    python benchmarks/quickstart_probes.py RUN/model          # table, then one JSON line
    python benchmarks/quickstart_probes.py RUN_A/model RUN_B/model   # side by side

Last line: {"models": {path: {"answered": n, "probes": m, "top1": {...}}}}.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (sentence with one [MASK], the answers its context allows). Chosen from the corpus's phrasing,
# not tuned on any model's output: each phrase occurs in the built-in corpus several times.
PROBES: list[tuple[str, tuple[str, ...]]] = [
    ("This function returns a [MASK] of strings.", ("list", "sequence", "tuple")),
    ("Changed in [MASK] 3.8: added the parameter.", ("version",)),
    ("New in [MASK] 3.2.", ("version",)),
    ("Return [MASK] if the object is an instance of the class.", ("True", "true")),
    ("The optional [MASK] argument specifies the encoding.", ("keyword", "encoding", "errors")),
    ("The file is opened in binary [MASK].", ("mode",)),
    ("Return the name of the [MASK] that defines the function.", ("module", "class", "file")),
    ("If the argument is omitted, the default [MASK] is None.", ("value",)),
    ("A ValueError is raised if the [MASK] is not valid.", ("input", "value", "argument", "source", "string", "name")),
    ("The function takes an iterable of [MASK] and returns a list.", ("strings", "items", "elements", "objects",
                                                                     "values", "pairs", "tuples")),
    ("Positional [MASK] are passed before keyword arguments.", ("arguments",)),
    ("The return [MASK] of the function is None.", ("value", "type")),
]


def answered(model_dir: str) -> dict:
    from transformers import AutoTokenizer

    from tpu_ray.train.export import load_unmasker

    predict = load_unmasker(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    vocab = tok.get_vocab()

    def one_token(word: str) -> bool:  # the word as it follows a space, and as it starts a sentence
        return any(len(tok.tokenize(w)) == 1 for w in (word, " " + word)) or word in vocab

    rows, hits, counted = [], 0, 0
    for text, answers in PROBES:
        if not any(one_token(a) for a in answers):
            rows.append((text, answers, None, None))
            continue
        counted += 1
        top = predict(text, 1)[0]
        word = top["token_str"].strip()
        ok = word in answers
        hits += ok
        rows.append((text, answers, word, top["score"]))
    return {"answered": hits, "probes": counted, "rows": rows}


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    dirs = sys.argv[1:]
    if not dirs:
        sys.exit("usage: python benchmarks/quickstart_probes.py MODEL_DIR [MODEL_DIR ...]")
    results = {d: answered(d) for d in dirs}
    for d, r in results.items():
        print(f"{d}: {r['answered']} of {r['probes']} probes answered from context")
        for text, answers, word, score in r["rows"]:
            mark = "skip (answers split by the tokenizer)" if word is None else (
                f"{'yes' if word in answers else 'no ':3s} {word!r} {score:.3f}")
            print(f"  {mark:28s} {text}  [{'/'.join(answers)}]")
    print(json.dumps({"models": {d: {"answered": r["answered"], "probes": r["probes"],
                                     "top1": {t: w for t, _, w, _ in r["rows"]}} for d, r in results.items()}}))


if __name__ == "__main__":
    main()
