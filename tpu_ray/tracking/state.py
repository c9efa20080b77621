"""RUN/tracking.json: which tracked run each tracker sends to, and how that went. Kept in the run
directory so that a resumed run, and `tpu-ray finetune` on the run, continue the same tracked run
instead of starting a new one each time."""

from __future__ import annotations

import json
import threading
from typing import Any

from tpu_ray import storage
from tpu_ray.redact import redact

TRACKING_FILE = "tracking.json"
_lock = threading.Lock()  # two trackers of one process update the file in turn


def read_state(run_dir: str) -> dict[str, Any]:
    """{tracker name: {run_id, status, ...}}; {} when nothing was tracked yet (or the file is damaged:
    a new tracked run is better than a run that cannot start)."""
    try:
        data = json.loads(storage.read_text(storage.join(run_dir, TRACKING_FILE)))
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_state(run_dir: str, tracker: str, **fields: Any) -> None:
    with _lock:
        data = read_state(run_dir)
        entry = data.get(tracker) if isinstance(data.get(tracker), dict) else {}
        # credentials never reach a file of the run (a URI's password, an error quoting one)
        data[tracker] = {**entry, **{k: redact(v) if isinstance(v, str) else v for k, v in fields.items()
                                     if v is not None}}
        if fields.get("status") != "dropped":
            data[tracker].pop("error", None)
        storage.atomic_write_text(storage.join(run_dir, TRACKING_FILE), json.dumps(data, indent=1) + "\n")
