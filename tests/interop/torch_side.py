"""The PyTorch half of tests/test_interop_torch.py, run by an interop venv's python (no TensorFlow).

Usage: python torch_side.py MODEL_DIR REFERENCE.npz TEXT, or python torch_side.py --serve
Loads MODEL_DIR with AutoModelForMaskedLM and pipeline("fill-mask") exactly as a user would, runs
the reference batch, and prints one JSON object: versions, loading info, the largest absolute
logit difference to the TensorFlow reference, and the pipeline's predictions for TEXT.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForMaskedLM, pipeline


def main(model_dir: str, reference: str, text: str) -> dict:
    ref = np.load(reference)
    model, info = AutoModelForMaskedLM.from_pretrained(model_dir, output_loading_info=True)
    model.eval()
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ref["input_ids"]),
                    attention_mask=torch.from_numpy(ref["attention_mask"])).logits.numpy()
    keep = ref["attention_mask"].astype(bool)  # padded positions' logits are not compared
    unmasker = pipeline("fill-mask", model=model_dir)
    preds = unmasker(text, top_k=5)
    return {
        "transformers": transformers.__version__, "torch": torch.__version__,
        "tensorflow_importable": importlib.util.find_spec("tensorflow") is not None,
        "model_class": type(model).__name__,
        "loading_info": {k: sorted(map(str, v)) for k, v in info.items()},
        "tied": model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr(),
        "shape": list(out.shape),
        "max_abs_diff": float(np.abs(out[keep] - ref["logits"][keep]).max()),
        "fill_mask": [{"token_str": p["token_str"], "score": float(p["score"])} for p in preds],
    }


def serve() -> None:
    """One request per stdin line, `{"fn": "logits" | "save_fresh", "args": [...]}`, one JSON answer
    per stdout line (`{"ok": ...}` or `{"error": traceback}`): the model-type matrix asks ~80 times
    in a run, and a process per question would import torch and transformers each time."""
    import traceback

    import save_fresh

    functions = {"logits": main, "save_fresh": save_fresh.main}
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = {"ok": functions[request["fn"]](*request["args"])}
        except Exception:  # the asking test fails with it
            answer = {"error": traceback.format_exc()}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        print(json.dumps(main(*sys.argv[1:4])))
