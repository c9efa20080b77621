"""Hugging Face datasets by name (`hf:NAME`): the Hub's data files, or a packaged builder's rows.

`hf:NAME` plans the data files `datasets` resolves for the split (hf://datasets/... URLs), each read
by its own format's reader, so each actor reads only its files and nothing is copied into a cache.
The packaged builders (`hf:text|json|csv|parquet` with `corpus.hf_config` as the files), and a
dataset whose files no reader reads (e.g. .arrow), are loaded with `datasets.load_dataset`: units
of rows (fmt "hf").
"""

from __future__ import annotations

from typing import Any

from tpu_ray.prepare import tabular
from tpu_ray.prepare.readers import detect
from tpu_ray.prepare.readers import register
from tpu_ray.prepare.readers.base import CorpusFile, PlanContext, SourceReader, WorkUnit
from tpu_ray.prepare.readers.saved import SavedDatasetReader

PACKAGED_BUILDERS = {"text", "json", "parquet", "csv"}  # hf:NAME read with load_dataset on hf_config's files


def hf_where(source: str, config: str | None) -> str:
    """How errors name an hf: dataset: the name and its configuration (the files, for hf:json etc.)."""
    return f"{source} (hf_config={config})" if config else source


@register
class BuilderReader(SavedDatasetReader):
    fmt = "hf"
    description = "a row range of a packaged datasets builder (hf:text|json|csv|parquet with hf_config as the files)"

    def dataset(self, unit: WorkUnit) -> tuple[Any, str]:
        ds = tabular.load_builder(unit.source[3:], unit.hf_config, unit.hf_split, "corpus.source")
        return ds, hf_where(unit.source, unit.hf_config)


@register
class HubSource(SourceReader):
    def claims(self, source: str) -> bool:
        return source.startswith("hf:") and not source.startswith("hf://")

    def listing(self, source: str, run_dir: str, field: str) -> list[CorpusFile] | None:
        return None  # planned by datasets' metadata, every time

    def plan(self, source: str, ctx: PlanContext) -> tuple[list[WorkUnit], list[CorpusFile]]:
        corpus = ctx.corpus
        name = source[3:]
        if name not in PACKAGED_BUILDERS:
            hub = [(f, detect(f, strict=False))
                   for f in tabular.hub_data_files(name, corpus.hf_config, corpus.hf_split, ctx.field)]
            if hub and all(d is not None for _, d in hub):
                return [], [CorpusFile(f, d[0], -1) for f, d in hub]  # type: ignore[index]
            # e.g. .arrow files: only datasets reads them
        ds = tabular.load_builder(name, corpus.hf_config, corpus.hf_split, ctx.field)
        builder = BuilderReader()
        return builder.plan_rows(ds, source, hf_where(source, corpus.hf_config), ctx), []
