"""Write a checkpoint PyTorch made itself (run by an interop venv's python): a PyTorch model of
SRC's config.json, initialised by PyTorch with a fixed seed, saved by `save_pretrained`, as a model
trained in PyTorch ships; SRC's tokenizer files beside it.

Why not load SRC and save it again: PyTorch ties some weights (ALBERT's decoder bias to the head's
bias, MobileBERT's decoder to the word embeddings) and its save drops the tied copy; weights loaded
from two separate tensors stay untied, so a round trip keeps what a PyTorch-trained model drops.

Usage: python save_fresh.py SRC_MODEL_DIR OUT_DIR. Prints one JSON object: versions and the files.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForMaskedLM

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def main(src: str, out: str) -> dict:
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(src))
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(out, name))
    return {"transformers": transformers.__version__, "files": sorted(os.listdir(out))}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
