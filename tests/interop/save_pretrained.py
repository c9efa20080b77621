"""Write a checkpoint directory the way PyTorch Transformers does (run by an interop venv's python).

Usage: python save_pretrained.py SRC_MODEL_DIR OUT_DIR
Loads SRC with AutoModelForMaskedLM and AutoTokenizer and `save_pretrained`s both into OUT: a
PyTorch-layout model.safetensors only (no tf_model.h5), as most Hub checkpoints ship today.
Prints one JSON object: versions and the files written.
"""

from __future__ import annotations

import json
import os
import sys

import transformers
from transformers import AutoModelForMaskedLM, AutoTokenizer


def main(src: str, out: str) -> dict:
    AutoModelForMaskedLM.from_pretrained(src).save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return {"transformers": transformers.__version__, "files": sorted(os.listdir(out))}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
