"""Records the shard pass skipped, accounted for over the whole corpus (none is
dropped without a count).

Why a module: a unit's actor sees only its unit, but two rules are about the corpus: a text field
that no record of the corpus has is a typo'd `corpus.text_field` (refused once, naming the fields
found), and records that cannot be read are skipped only up to `corpus.max_bad_fraction` of the
corpus's records. Each unit reports its counts (kept in the manifest's unit_stats, so a resumed
pass still knows them) and writes the list of its bad records to `bad_records/unit-N.jsonl`; the
driver checks both rules at the end and merges the lists in unit order into `bad_records.jsonl`:
the same file whatever the number of actors.
"""

from __future__ import annotations

import json
from typing import Any

from tpu_ray import storage
from tpu_ray.errors import UserError
from tpu_ray.prepare.streams import Counts, require_field

BAD_FILE = "bad_records.jsonl"  # in the shard directory: every skipped bad record, in unit order
UNIT_DIR = "bad_records"  # each unit's own list, written by its actor
# Per-unit result keys (process_unit) -> their names in the manifest's unit_stats.
STAT_KEYS = {"records": "records", "with_field": "with_field", "missing": "missing", "bad_records": "bad",
             "skipped_by_kind": "kinds", "first_missing": "first_missing"}


def unit_path(out_dir: str, unit: int) -> str:
    return storage.join(out_dir, UNIT_DIR, f"unit-{unit:06d}.jsonl")


def unit_stats(index: int, counts: Counts, out_dir: str) -> dict[str, Any]:
    """What a unit adds to its result: its record counts; its bad records written (atomically) to
    its own list, before the unit is committed."""
    if counts.bad:
        path = unit_path(out_dir, index)
        if not storage.is_remote(out_dir):
            storage.makedirs(storage.join(out_dir, UNIT_DIR))
        storage.atomic_write_text(path, "".join(json.dumps({**b, "unit": index}) + "\n" for b in counts.bad))
    return {"records": counts.records, "with_field": counts.with_field, "missing": counts.missing,
            "bad_records": len(counts.bad), "skipped_by_kind": dict(counts.by_kind),
            "first_missing": list(counts.first_missing) if counts.first_missing else None}


def skipped_by_kind(results: dict[int, dict]) -> dict[str, int]:
    """Records skipped for want of text (null or missing field, short rows), by file kind."""
    out: dict[str, int] = {}
    for r in results.values():
        for kind, n in (r.get("skipped_by_kind") or {}).items():
            out[kind] = out.get(kind, 0) + n
    return dict(sorted(out.items()))


def check_corpus(results: dict[int, dict], text_field: str, max_bad_fraction: float, out_dir: str) -> int:
    """The corpus-wide rules at the end of a pass over one source; see check_sources."""
    return check_sources(results, [(None, sorted(results), text_field, max_bad_fraction)], out_dir)


def check_sources(results: dict[int, dict], groups: list[tuple[str | None, list[int], str, float]],
                  out_dir: str) -> int:
    """The corpus-wide rules at the end of a pass, source by source (`groups`: the config field that
    names each, None for the one-source corpus; its units; its text field; its max_bad_fraction);
    returns the bad records skipped, all listed in BAD_FILE in unit order.

    A source where records lack the text field and none has it is refused (one line, the fields
    found). Bad records past `max_bad_fraction` of a source's records fail the pass, naming the
    count and the list."""
    path = storage.join(out_dir, BAD_FILE)
    bad = sum(r.get("bad_records", 0) for r in results.values())
    if bad:
        lines = [storage.read_text(unit_path(out_dir, i)) for i in sorted(results) if results[i].get("bad_records")]
        storage.atomic_write_text(path, "".join(lines))
    elif storage.exists(path):  # from an earlier pass over a corpus since fixed
        storage.remove(path)
    for name, units, text_field, max_bad_fraction in groups:
        ordered = [results[i] for i in units if i in results]
        where = f"{name}: " if name else ""
        if not any(r.get("with_field") or r.get("with_field") is None and r.get("tokens") for r in ordered):
            try:
                require_field([_counts(r) for r in ordered], text_field)
            except UserError as exc:
                raise UserError(f"{where}{exc}") from None
        n_bad = sum(r.get("bad_records", 0) for r in ordered)
        records = sum(r.get("records", 0) for r in ordered)
        if n_bad > max_bad_fraction * records:
            field = f"{name}.max_bad_fraction" if name else "corpus.max_bad_fraction"
            raise UserError(f"{where}{n_bad:,} bad records of {records:,} ({n_bad / max(records, 1):.3%}) exceed "
                            f"{field}={max_bad_fraction}; they are listed in {path}; fix or remove them, or raise "
                            f"{field}")
    return bad


def _counts(result: dict) -> Counts:
    first = result.get("first_missing")
    return Counts(with_field=result.get("with_field") or 0, missing=result.get("missing") or 0,
                  first_missing=(first[0], list(first[1])) if first else None)
