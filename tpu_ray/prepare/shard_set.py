"""The shard set: one typed owner of `manifest.json` and of the shard files it lists.

Every stage that touches shards goes through `ShardSet`: the shard stage writes it and resumes
from it, training and eval take their files from it, training start verifies it, doctor and
report describe it. So the manifest's schema, its validation (a manifest is input: copied,
edited, downloaded), the resume state and the verification against the files live in one place,
and all the file facts come from one listing of the shard directory (no `exists` or `size`
request per shard: at 10,000 shards those would be minutes with a TPU slice reserved and idle).

Shards without a manifest (written by Hugging Face's reference scripts, or their
`<split>/*.tfrecord` folders) are a ShardSet too: the sample counts come from their names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpu_ray import rundir, storage
from tpu_ray.confine import is_confined
from tpu_ray.errors import UserError, first_line
from tpu_ray.prepare.tfrecord import read_records

log = logging.getLogger(__name__)

FORMAT = "tpu-ray-shards/2"  # /2: one folder per split; /1 (one folder for both) still trains
OLD_FORMAT = "tpu-ray-shards/1"
SPLITS = ("train", "validation")
REBUILD = "delete it to rebuild the shards"
SHARD_FIX = "delete it and rerun `tpu-ray shard` to rewrite it"
# Below this many bytes of shards, training hashes every shard before it starts; above, a sample.
CHEAP_HASH_BYTES = 256 << 20
SAMPLE = 3  # shards hashed by a sampled check (first, middle, last)


def manifest_path(shards_dir: str) -> str:
    return storage.join(shards_dir, rundir.MANIFEST_FILE)


@dataclass(frozen=True)
class ShardEntry:
    """One shard file: its path relative to the shard directory (`<split>/<name>`) and what the
    manifest recorded of it (absent for shards counted from their names)."""

    split: str
    path: str
    samples: int
    unit: int | None = None
    tokens: int | None = None
    bytes: int | None = None
    sha256: str | None = None

    def record(self) -> dict[str, Any]:
        """The entry as the manifest stores it (under its split, so without `split`)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "split" and v is not None}


@dataclass
class ShardSet:
    """The shards of one directory and the manifest that describes them (see the module doc)."""

    directory: str
    entries: list[ShardEntry]
    manifest: bool = True  # False: no manifest.json; counts come from the shard names
    complete: bool = True
    format: str | None = FORMAT
    seq_len: int | None = None
    tokenizer_sha256: str | None = None
    vocab_size: int | None = None
    special_ids: dict[str, int] | None = None
    source: dict[str, Any] | None = None
    plan_sha256: str | None = None
    units: int | None = None
    units_done: list[int] = field(default_factory=list)
    corpus_tokens: int = 0
    dropped_tokens: int = 0
    skipped_records: int = 0  # records whose text field was null or missing (records.py's rule)
    skipped_by_kind: dict[str, int] = field(default_factory=dict)  # those records by file kind
    bad_records: int = 0  # records that could not be read, skipped (corpus.bad_records=skip)
    unit_stats: list[dict[str, int]] = field(default_factory=list)
    # The run directory whose shard stage made them; recorded for an explicit shard.dir only (a
    # run's default RUN/shards is RUN's, and its manifest stays the same bytes wherever RUN is).
    owner: str | None = None
    recorded_samples: dict[str, int] = field(default_factory=dict)  # each split's total as written
    # A mixture's sources: {name: {"units": [first, last + 1], "evaluation_only": bool}}; None: one source.
    sources: dict[str, dict[str, Any]] | None = None
    _sizes: dict[str, int] | None = field(default=None, repr=False, compare=False)

    # -- reading -------------------------------------------------------------------------------
    @classmethod
    def load(cls, shards_dir: str) -> ShardSet | None:
        """The manifest's shard set, validated; None when there is no manifest."""
        path = manifest_path(shards_dir)
        try:
            raw = storage.read_bytes(path)  # one request: no `exists` first
        except (FileNotFoundError, NotADirectoryError):
            if not storage.is_remote(path) and os.path.islink(path):  # never "no manifest": that trains unchecked
                raise UserError(f"{path}: a symbolic link to a missing file ({os.readlink(path)}); restore the "
                                f"manifest or {REBUILD}") from None
            return None
        except IsADirectoryError:
            raise UserError(f"{path}: is a directory, not a manifest; remove it to rebuild the shards") from None
        except OSError as exc:  # a symlink loop, a permission: named, never taken for "no manifest"
            raise UserError(f"{path}: cannot be read ({exc.strerror or exc}); fix it or {REBUILD}") from None
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):  # bad JSON or UTF-8, a 5,000-digit number, 100,000 brackets
            raise UserError(f"{path}: manifest is not valid JSON; {REBUILD}") from None
        return cls.from_json(shards_dir, data, path)

    @classmethod
    def open(cls, shards_dir: str) -> ShardSet:
        """The shard set training reads: the manifest's, or else the `.tfrecord` files found by
        name (empty if there are none)."""
        return cls.load(shards_dir) or cls.from_names(shards_dir)

    @classmethod
    def from_names(cls, shards_dir: str) -> ShardSet:
        """Shards without a manifest: `<split>/*.tfrecord` (Hugging Face's reference layout) or
        `<split>-*.tfrecord` in one folder (tpu-ray before format /2), counts from `-<count>`."""
        entries = []
        for split in SPLITS:
            files = storage.glob(storage.join(shards_dir, split, "*.tfrecord"))
            folder = f"{split}/" if files else ""
            files = files or storage.glob(storage.join(shards_dir, f"{split}-*.tfrecord"))
            for path in files:
                samples = _name_count(path)
                if samples is None or samples < 1:
                    raise UserError(f"{path}: shard name has no sample count of at least 1 ('-<index>-<count>"
                                    f".tfrecord') and there is no manifest.json; rename it or make shards with "
                                    f"tpu-ray shard")
                entries.append(ShardEntry(split, folder + path.rsplit("/", 1)[-1], samples))
        return cls(shards_dir, entries, manifest=False, format=None)

    @classmethod
    def from_json(cls, shards_dir: str, data: Any, path: str) -> ShardSet:
        """Validate a manifest's JSON (its shape, its types, every path inside the shard directory)."""
        splits = data.get("splits") if isinstance(data, dict) else None
        if not isinstance(splits, dict) or not all(isinstance(splits.get(s), dict) for s in SPLITS):
            raise UserError(f"{path}: not a tpu-ray shard manifest (no train/validation splits); {REBUILD}")
        header = {name: _field(data, name, kind, path) for name, kind in _HEADER.items()}
        if header["format"] not in (None, FORMAT, OLD_FORMAT):
            raise UserError(f"{path}: format {header['format']!r} is not a tpu-ray shard format ({FORMAT}); {REBUILD}")
        units = header["units"]
        entries: list[ShardEntry] = []
        for split in SPLITS:
            shards = splits[split].get("shards")
            if not isinstance(shards, list):
                raise UserError(f"{path}: {split}.shards is not a list; {REBUILD}")
            for i, raw in enumerate(shards):
                entries.append(_entry(raw, split, i, path, units))
        seen: set[str] = set()
        for e in entries:  # one file counted twice, or a train shard scored as validation
            if e.path in seen:
                raise UserError(f"{path}: {e.path} is listed twice; the manifest was edited: {REBUILD}")
            seen.add(e.path)
        totals = {s: _field(splits[s], "samples", int, f"{path}: {s}") for s in SPLITS}
        for u in header["units_done"] or []:
            if not _is_int(u) or not _in_range(u, units):
                raise UserError(f"{path}: units_done holds {repr(u)[:20]}, not a unit number below units={units}; "
                                f"{REBUILD}")
        for i, stats in enumerate(header["unit_stats"] or []):
            where = f"{path}: unit_stats[{i}]"
            for key in ("unit", "tokens", "dropped", "skipped"):
                value = _field(stats if isinstance(stats, dict) else {}, key, int, where)
                if key != "skipped" and value is None or value is not None and value < 0:
                    raise UserError(f"{where} lacks {key}, a whole number >= 0; {REBUILD}")
        complete = _field(data, "complete", bool, path)
        sources = _sources(data, path, units)
        if sources is not None:
            for e in entries:
                if e.unit is None or not any(m["units"][0] <= e.unit < m["units"][1] for m in sources.values()):
                    raise UserError(f"{path}: {e.path} (unit {e.unit}) belongs to none of the sources "
                                    f"{', '.join(sources)}; {REBUILD}")
        return cls(shards_dir, entries, complete=complete is True,  # absent: not known to be finished
                   sources=sources,
                   recorded_samples={s: n for s, n in totals.items() if n is not None},
                   **{k: v for k, v in header.items() if v is not None})

    # -- writing (the shard stage) --------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The manifest: the layout earlier versions wrote, so older readers keep reading it."""
        splits: dict[str, dict[str, Any]] = {}
        for split in SPLITS:
            mine = self.split_entries(split)
            splits[split] = {"samples": sum(e.samples for e in mine), "tokens": sum(e.tokens or 0 for e in mine),
                             "shards": [e.record() for e in mine]}
        return {"format": self.format, "complete": self.complete, "seq_len": self.seq_len,
                "tokenizer_sha256": self.tokenizer_sha256, "vocab_size": self.vocab_size,
                "special_ids": self.special_ids, "source": self.source, "plan_sha256": self.plan_sha256,
                "units": self.units, "units_done": self.units_done, "corpus_tokens": self.corpus_tokens,
                "dropped_tokens": self.dropped_tokens, "skipped_records": self.skipped_records,
                "skipped_by_kind": self.skipped_by_kind, "bad_records": self.bad_records,
                "splits": splits, "unit_stats": self.unit_stats,
                **({"sources": self.sources} if self.sources is not None else {}),
                **({"owner": self.owner} if self.owner else {})}

    def write(self) -> None:
        """Commit the manifest atomically (a crash leaves the previous one whole)."""
        storage.atomic_write_text(manifest_path(self.directory),
                                  json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")

    # -- what the trainers read -----------------------------------------------------------------
    def split_entries(self, split: str, source: str | None = None) -> list[ShardEntry]:
        return [e for e in self.entries if e.split == split and (source is None or self.source_of(e) == source)]

    def files(self, split: str, source: str | None = None) -> list[tuple[str, int]]:
        """(full path, samples) of a split's shards (of one source: `source`), in manifest order."""
        return [(storage.join(self.directory, e.path), e.samples) for e in self.split_entries(split, source)]

    def samples(self, split: str, source: str | None = None) -> int:
        return sum(e.samples for e in self.split_entries(split, source))

    def source_names(self) -> list[str]:
        """The sources of these shards: a mixture's names in config order, else the one "corpus"."""
        return list(self.sources) if self.sources is not None else ["corpus"]

    def evaluation_only(self, source: str) -> bool:
        return bool((self.sources or {}).get(source, {}).get("evaluation_only"))

    def source_of(self, entry: ShardEntry) -> str:
        """The source a shard was made from (by its unit's number); "corpus" for one-source sets."""
        if self.sources is None:
            return "corpus"
        for name, meta in self.sources.items():
            first, end = meta["units"]
            if entry.unit is not None and first <= entry.unit < end:
                return name
        return "?"  # from_json refuses such an entry; this is for sets built in memory

    def require_complete(self) -> None:
        if not self.complete:
            raise UserError(f"{manifest_path(self.directory)}: sharding did not finish; rerun `tpu-ray shard` "
                            f"to resume it")

    def mismatches(self, tok: Any, seq_len: int, tokenizer_dir: str = "the tokenizer") -> list[str]:
        """How these shards disagree with a tokenizer (TokenizerInfo, from `tokenizer_dir`) and
        seq_len; [] when they agree or when there is no manifest to say (reference scripts' shards)."""
        if not self.manifest:
            return []
        where = f"{manifest_path(self.directory)}:"
        out = []
        if self.tokenizer_sha256 != tok.sha256:
            out.append(f"{where} shards were made with tokenizer {str(self.tokenizer_sha256)[:12]}, but "
                       f"{tokenizer_dir} is {tok.sha256[:12]}")
        if self.seq_len != seq_len:
            out.append(f"{where} shards have seq_len={self.seq_len}, config says shard.seq_len={seq_len}")
        return out

    def vocab_mismatches(self, tok: Any) -> list[str]:
        """The vocabulary size and special ids the shards were made with, against the tokenizer's."""
        out = []
        if self.vocab_size not in (None, tok.vocab_size):
            out.append(f"shards were made with vocab_size {self.vocab_size}, tokenizer has {tok.vocab_size}")
        if self.special_ids not in (None, special_ids_of(tok)):
            out.append(f"shards' special ids {self.special_ids} != tokenizer's {special_ids_of(tok)}")
        return out

    def require_made_with(self, tok: Any, seq_len: int, tokenizer_dir: str) -> None:
        problems = self.mismatches(tok, seq_len, tokenizer_dir)
        if problems:
            raise UserError(f"{problems[0]}; reshard, or point tokenizer.path / shard.seq_len "
                            f"at what the shards were made with")

    # -- verification, from one listing ----------------------------------------------------------
    def sizes(self) -> dict[str, int]:
        """Every file's size under the shard directory, by relative path: one listing, cached."""
        if self._sizes is None:
            self._sizes = storage.find_sizes(self.directory)
        return self._sizes

    def totals_problem(self) -> str | None:
        """A split whose recorded total disagrees with the sum over its shards (an edited manifest)."""
        for split, total in self.recorded_samples.items():
            listed = self.samples(split)
            if listed != total:
                return (f"{manifest_path(self.directory)}: {split} lists {listed} samples in its shards but a total "
                        f"of {total}")
        return None

    def deep_checked(self, full: bool = False) -> set[str]:
        """Paths of the shards whose sha256 and record counts are read: all when they total at most
        CHEAP_HASH_BYTES (what training checks before it starts) or `full`, else first, middle, last.
        Training and `tpu-ray doctor` both use this, so the doctor never checks less than training."""
        sizes = self.sizes() if not self.manifest else {}  # names-only sets: sizes from the listing
        cheap = sum(e.bytes or sizes.get(e.path, 0) for e in self.entries) <= CHEAP_HASH_BYTES
        return {e.path for e in sampled(self.entries, full=full or cheap)}

    def problem(self, entry: ShardEntry, deep: bool) -> str | None:
        """None if the shard matches its entry, else what is wrong, naming the file (callers add
        SHARD_FIX). Shallow: present with the recorded size (from the listing). Deep: also its
        sha256 and record count (reads it)."""
        path = storage.join(self.directory, entry.path)
        if entry.path not in self.sizes():
            return f"{path}: listed in manifest.json but missing" if self.manifest else f"{path}: missing"
        size = self.sizes()[entry.path]
        if entry.bytes is not None and size != entry.bytes:
            return f"{path}: {size} bytes, manifest.json says {entry.bytes} (truncated or rewritten)"
        if not deep:
            return None
        data = storage.read_bytes(path)
        digest = hashlib.sha256(data).hexdigest()
        if entry.sha256 and digest != entry.sha256:
            return f"{path}: sha256 {digest[:12]} does not match manifest.json ({entry.sha256[:12]})"
        try:
            n = count_records(data)
        except ValueError as exc:
            return f"{path}: {exc} (corrupt TFRecord)"
        if n != entry.samples:
            said = "manifest.json says" if self.manifest else "its name says"
            return f"{path}: {n} records, {said} {entry.samples}"
        return None

    def verify(self, full: bool = False, splits: Sequence[str] = SPLITS) -> None:
        """Raise a UserError naming the first shard of `splits` that does not match the manifest:
        sizes always, contents of `deep_checked(full)`. Without a manifest the names' counts are
        what there is to check: records are counted under the same bound."""
        deep = self.deep_checked(full)
        for entry in (e for e in self.entries if e.split in splits):
            problem = self.problem(entry, entry.path in deep)
            if problem:
                raise UserError(f"{problem}; {SHARD_FIX}")

    @contextlib.contextmanager
    def naming_corrupt_files(self) -> Iterator[None]:
        """tf.data's DataLossError names no file: turn it into a one-line UserError naming the shard
        (found by reading the framing in Python, on the error path only)."""
        import tensorflow as tf

        try:
            yield
        except tf.errors.NotFoundError as exc:  # a shard deleted after the check (or never checked)
            raise UserError(f"{first_line(exc, 200)}; rerun `tpu-ray shard` to rewrite the missing shard") from None
        except tf.errors.DataLossError as exc:
            bad = find_corrupt([p for split in SPLITS for p, _ in self.files(split)])
            what = f"{bad}: truncated or corrupt TFRecord" if bad else f"{self.directory}: corrupt TFRecord data"
            raise UserError(f"{what} ({first_line(exc, 120)}); delete it and rerun `tpu-ray shard`") from None

    # -- resume (the shard stage) ----------------------------------------------------------------
    def committed_units(self, plan_sha256: str, tokenizer_sha256: str, seq_len: int,
                        owned: bool = True) -> dict[int, dict]:
        """The units an earlier (crashed or finished) attempt over the same plan committed, as the
        shard stage's per-unit results; a unit one of whose files vanished is left out (redone).

        An unfinished attempt over another plan (bad input fixed since, Ctrl-C, then an edit) is
        this stage's own output, never trained on: it is removed with a warning and {} returned.
        A finished set over another plan is refused: those shards may be another run's input.
        Shards another run made (`owned` False) are only ever read: a mismatch or an unfinished
        set is refused in one line naming that run, never discarded."""
        where = manifest_path(self.directory)
        if self.format != FORMAT:
            raise UserError(f"{where}: shards in the old one-folder layout ({self.format}); they still train, "
                            f"but to shard again delete them or use a new output directory")
        same = (self.plan_sha256, self.tokenizer_sha256, self.seq_len) == (plan_sha256, tokenizer_sha256, seq_len)
        if not owned and not same:
            raise UserError(f"{where}: these shards belong to run {self.owner_run()} and were made from another corpus, "
                            f"tokenizer or seq_len; they are left as they are: use another shard.dir, or that run's "
                            f"corpus, tokenizer.path and shard.seq_len")
        if not owned and not self.complete:
            raise UserError(f"{where}: these shards belong to run {self.owner_run()} and are unfinished; finish them "
                            f"from that run (tpu-ray shard --output-dir {self.owner_run()}) or use another shard.dir")
        if not same and not self.complete:
            log.warning("shard: %s is an unfinished attempt over another corpus plan, tokenizer or seq_len (a file "
                        "changed since?); sharding again from the first unit", where)
            self.discard()
            return {}
        if not same:
            raise UserError(f"{where}: these shards were made from another corpus, tokenizer or seq_len; use a new "
                            f"output directory or delete the shards")
        done: dict[int, dict] = {u: {"unit": u, "shards": [], "tokens": 0, "dropped_tokens": 0}
                                 for u in self.units_done}
        present, redo = self.sizes(), set()
        for entry in self.entries:
            if entry.unit is None:
                raise UserError(f"{where}: {entry.path} has no unit; the manifest was edited: {REBUILD}")
            if entry.path not in present or entry.bytes is not None and present[entry.path] != entry.bytes:
                redo.add(entry.unit)  # a committed file vanished, was cut or rewritten: redo its unit
            elif entry.unit in done:
                done[entry.unit]["shards"].append({"split": entry.split, **entry.record()})
        from tpu_ray.prepare.bad_records import STAT_KEYS

        stats = {s["unit"]: s for s in self.unit_stats}
        for unit, result in done.items():
            s = stats.get(unit)
            if s is None:
                redo.add(unit)
                continue
            result.update(tokens=s["tokens"], dropped_tokens=s["dropped"], skipped_records=s.get("skipped", 0),
                          **{k: s[m] for k, m in STAT_KEYS.items() if m in s})  # record counts
            # Every token a unit kept is in its samples: [CLS] + seq_len-2 + [SEP] each. A unit whose
            # entries do not add up lost one (an edited manifest): redo it rather than trust it.
            if sum(e["samples"] for e in result["shards"]) * (seq_len - 2) != s["tokens"] - s["dropped"]:
                redo.add(unit)
        if redo & done.keys() and not owned:  # redoing would write into another run's set and manifest
            missing = sorted(e.path for e in self.entries if e.unit in redo)
            raise UserError(f"{where}: these shards belong to run {self.owner_run()} and {len(redo & done.keys())} of "
                            f"their units lost or changed a file (e.g. {missing[0] if missing else '?'}); they are "
                            f"left as they are: redo them from that run (tpu-ray shard --output-dir "
                            f"{self.owner_run()}) or use another shard.dir")
        if redo & done.keys():
            log.warning("shard: %d committed unit(s) do not match their files or records in %s; redoing them",
                        len(redo & done.keys()), where)
        return {u: r for u, r in done.items() if u not in redo}

    def owner_run(self) -> str:
        """The run that made these shards: the recorded owner, else the directory holding the
        shard directory (RUN of RUN/shards, where a run shards by default)."""
        return self.owner or self.directory.rstrip("/").rsplit("/", 1)[0]

    def discard(self) -> None:
        """Remove the listed shards that exist, then the manifest."""
        present = self.sizes()
        for entry in self.entries:
            if entry.path in present:
                storage.remove(storage.join(self.directory, entry.path))
        storage.remove(manifest_path(self.directory))
        self._sizes = None

    # -- describing (doctor, report) ---------------------------------------------------------------
    def describe(self) -> list[tuple[str, str]]:
        """(label, value) rows a person reads: counts per split, where they came from."""
        rows = [("shards", f"{len(self.entries)} ({len(self.split_entries('train'))} train, "
                           f"{len(self.split_entries('validation'))} validation)"),
                ("samples", f"{self.samples('train'):,} train, {self.samples('validation'):,} validation")]
        if not self.manifest:
            return rows + [("manifest", "none: counts from the shard names")]
        rows += [("complete", "yes" if self.complete else f"no ({len(self.units_done)} of {self.units} units)"),
                 ("seq_len", str(self.seq_len)),
                 ("corpus tokens", f"{self.corpus_tokens:,} ({self.dropped_tokens:,} dropped as unit remainders)"),
                 ("skipped records", f"{self.skipped_records:,}" + (" (" + ", ".join(
                     f"{k}: {n:,}" for k, n in self.skipped_by_kind.items()) + ")" if self.skipped_by_kind else "")),
                 ("bad records", f"{self.bad_records:,}" + (" (listed in bad_records.jsonl)" if self.bad_records
                                                             else "")),
                 ("tokenizer", str(self.tokenizer_sha256)[:12])]
        for name in self.source_names() if self.sources is not None else []:
            only = " (evaluation only)" if self.evaluation_only(name) else ""
            rows.append((f"source {name}", f"{self.samples('train', name):,} train, "
                                           f"{self.samples('validation', name):,} validation{only}"))
        return rows

    @classmethod
    def from_results(cls, shards_dir: str, *, seq_len: int, tok: Any, source: dict[str, Any], plan_sha256: str,
                     units: int, results: dict[int, dict], complete: bool,
                     sources: dict[str, dict[str, Any]] | None = None, owner: str | None = None) -> ShardSet:
        """The shard stage's per-unit results (process_unit's) as a shard set, units in order."""
        from tpu_ray.prepare.bad_records import STAT_KEYS, skipped_by_kind

        entries = [ShardEntry(**entry) for idx in sorted(results) for entry in results[idx]["shards"]]
        entries.sort(key=lambda e: SPLITS.index(e.split))  # stable: train, then validation, each by unit
        return cls(
            shards_dir, entries, complete=complete, seq_len=seq_len, tokenizer_sha256=tok.sha256,
            vocab_size=tok.vocab_size,
            special_ids=special_ids_of(tok),
            source=source, plan_sha256=plan_sha256, units=units, units_done=sorted(results), sources=sources,
            owner=owner,
            corpus_tokens=sum(r["tokens"] for r in results.values()),
            dropped_tokens=sum(r["dropped_tokens"] for r in results.values()),
            skipped_records=sum(r.get("skipped_records", 0) for r in results.values()),
            skipped_by_kind=skipped_by_kind(results),
            bad_records=sum(r.get("bad_records", 0) for r in results.values()),
            unit_stats=[{"unit": k, "tokens": v["tokens"], "dropped": v["dropped_tokens"],
                         "skipped": v.get("skipped_records", 0),
                         **{m: v[k2] for k2, m in STAT_KEYS.items()  # record counts (skipped records)
                            if v.get(k2) or k2 == "with_field" and k2 in v}}
                        for k, v in sorted(results.items())])


# The manifest's header fields and their JSON types (None allowed: older manifests lack some).
_HEADER: dict[str, type | tuple[type, ...]] = {
    "format": str, "seq_len": int, "tokenizer_sha256": str, "vocab_size": int, "special_ids": dict,
    "source": dict, "plan_sha256": str, "units": int, "units_done": list, "corpus_tokens": int,
    "dropped_tokens": int, "skipped_records": int, "unit_stats": list, "skipped_by_kind": dict, "bad_records": int,
    "owner": str}
_ENTRY: dict[str, type] = {"unit": int, "tokens": int, "bytes": int, "sha256": str}


def _field(data: dict, name: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise UserError(f"{where}: {name} is {type(value).__name__} {str(value)[:40]!r}, not "
                        f"{getattr(kind, '__name__', kind)}; {REBUILD}")
    return value


def _entry(raw: Any, split: str, i: int, path: str, units: int | None) -> ShardEntry:
    """One shard entry, validated: a shard the writer could have made (>= 1 sample, the count its
    name carries, a sha256, its split's name, a unit of the plan), so nothing downstream (input
    positions, resume, eval) ever computes with a count or a file it should not have."""
    where = f"{path}: {split}.shards[{i}]"
    name = raw.get("path") if isinstance(raw, dict) else None
    samples = raw.get("samples") if isinstance(raw, dict) else None
    if not isinstance(name, str) or not _is_int(samples):
        raise UserError(f"{where} lacks a path or a sample count; {REBUILD}")
    if not is_confined(name):
        raise UserError(f"{where} path {name!r} points outside the shard directory; the manifest was edited or is "
                        f"not from tpu-ray: {REBUILD}")
    if not name.rsplit("/", 1)[-1].startswith(f"{split}-"):
        raise UserError(f"{where} path {name!r} is not a {split} shard ({split}-...); {REBUILD}")
    if not 1 <= samples < 2**63:
        raise UserError(f"{where}: samples is {samples}, not a count of at least 1; {REBUILD}")
    named = _name_count(name)
    if named is not None and named != samples:
        raise UserError(f"{where}: samples is {samples}, its name says {named}; {REBUILD}")
    extra = {k: _field(raw, k, kind, where) for k, kind in _ENTRY.items()}
    if extra["bytes"] is not None and extra["bytes"] < 1:
        raise UserError(f"{where}: bytes is {extra['bytes']}, not a file size; {REBUILD}")
    if extra["sha256"] is not None and not re.fullmatch(r"[0-9a-f]{64}", extra["sha256"]):
        raise UserError(f"{where}: sha256 {extra['sha256'][:70]!r} is not a sha256 (64 hex digits); {REBUILD}")
    if extra["unit"] is not None and not _in_range(extra["unit"], units):
        raise UserError(f"{where}: unit {extra['unit']} is not a unit of the plan (0..{units}); {REBUILD}")
    return ShardEntry(split, name, samples, **extra)


def _sources(data: dict, path: str, units: int | None) -> dict[str, dict[str, Any]] | None:
    """A mixture manifest's `sources`, validated: names, unit ranges that tile 0..units in order."""
    raw = data.get("sources")
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise UserError(f"{path}: sources is not a mapping of source names; {REBUILD}")
    out, expect = {}, 0
    # By first unit: the manifest is written with sorted keys; the units follow the config's order.
    for name, meta in sorted(raw.items(), key=lambda kv: _first_unit(kv[1])):
        rng = meta.get("units") if isinstance(meta, dict) else None
        if (not isinstance(rng, list) or len(rng) != 2 or not all(_is_int(x) for x in rng) or rng[0] != expect
                or rng[1] < rng[0] or not isinstance(meta.get("evaluation_only"), bool)
                or not is_confined(str(name)) or "/" in str(name)):
            raise UserError(f"{path}: sources.{str(name)[:40]} is not a source entry (units [first, end) following "
                            f"the one before, evaluation_only); {REBUILD}")
        out[str(name)] = {"units": list(rng), "evaluation_only": meta["evaluation_only"]}
        expect = rng[1]
    if units is not None and expect != units:
        raise UserError(f"{path}: the sources' units end at {expect}, the plan has units={units}; {REBUILD}")
    return out


def _first_unit(meta: Any) -> int:
    rng = meta.get("units") if isinstance(meta, dict) else None
    return rng[0] if isinstance(rng, list) and rng and _is_int(rng[0]) else -1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _in_range(unit: int, units: int | None) -> bool:
    return unit >= 0 and (units is None or unit < units)


def _name_count(name: str) -> int | None:
    """The sample count a shard's name carries (`...-<count>.tfrecord`, the reference convention)."""
    match = re.search(r"-(\d+)\.tfrecord$", name)
    return int(match.group(1)) if match and len(match.group(1)) < 20 else None


def sampled(entries: Sequence[ShardEntry], full: bool) -> list[ShardEntry]:
    """All entries, or a deterministic sample of SAMPLE: first, middle, last."""
    if full or len(entries) <= SAMPLE:
        return list(entries)
    return [entries[i] for i in sorted({0, len(entries) // 2, len(entries) - 1})]


def special_ids_of(tok: Any) -> dict[str, int]:
    """A TokenizerInfo's special ids as the manifest records them."""
    return {"cls": tok.cls_id, "sep": tok.sep_id, "pad": tok.pad_id, "unk": tok.unk_id, "mask": tok.mask_id}


def count_records(data: bytes) -> int:
    """Records in TFRecord bytes; ValueError if the framing or a CRC is broken (truncation)."""
    return sum(1 for _ in read_records(io.BytesIO(data)))


def find_corrupt(files: Sequence[str]) -> str | None:
    """The first file whose TFRecord framing is broken (read in Python, on the error path only)."""
    for path in files:
        try:
            count_records(storage.read_bytes(path))
        except (ValueError, OSError):
            return path
    return None
