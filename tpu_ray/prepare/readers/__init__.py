"""The corpus readers: one module per format, found by the registry (a new format is one module).

Each module defines a `Reader` (a file format: plans a file's units, reads a unit's text) or a
`SourceReader` (a source given by name: `builtin:...`, `hf:NAME`) and registers it with `@register`;
the registry imports every module of this package, so a new format is one new file here.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TypeVar

from tpu_ray.errors import UserError
from tpu_ray.prepare.formats import COMPRESSIONS, UNSUPPORTED, Format

from tpu_ray.prepare.readers.base import (CorpusFile, PlanContext, Reader, SourceReader, WorkUnit,  # noqa: F401
                                          decode_text)

_FORMATS: dict[str, Reader] = {}
_SOURCES: list[SourceReader] = []
_T = TypeVar("_T", bound=type)


def register(cls: _T) -> _T:
    """Class decorator: make a Reader (by its fmt) or a SourceReader known to the planner."""
    if issubclass(cls, Reader):
        if cls.fmt in _FORMATS:  # pragma: no cover - a programming error
            raise AssertionError(f"two readers for format {cls.fmt!r}")
        _FORMATS[cls.fmt] = cls()
    elif issubclass(cls, SourceReader):
        _SOURCES.append(cls())
    else:  # pragma: no cover
        raise TypeError(f"{cls.__name__} is neither a Reader nor a SourceReader")
    return cls


_loaded = False


def _load() -> None:
    """Import every module of the package once (each registers its readers)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        if module != "base":
            importlib.import_module(f"{__name__}.{module}")


def formats() -> dict[str, Reader]:
    """Every format reader, by the fmt of the units it reads."""
    _load()
    return dict(_FORMATS)


def reader(fmt: str) -> Reader:
    _load()
    try:
        return _FORMATS[fmt]
    except KeyError:  # pragma: no cover - a unit can only be planned by a registered reader
        raise AssertionError(f"no reader for format {fmt!r}") from None


def source_reader(source: str) -> SourceReader | None:
    """The reader of a source given by name, or None for paths, globs and URIs (listed as files)."""
    _load()
    return next((s for s in _SOURCES if s.claims(source)), None)


_TABLES: dict[int, tuple[dict[str, str], frozenset[str]]] = {}


def _tables() -> tuple[dict[str, str], frozenset[str]]:
    _load()
    if len(_FORMATS) not in _TABLES:  # detect() runs per listed file: built once, not per call
        _TABLES[len(_FORMATS)] = ({suffix: r.fmt for r in _FORMATS.values() for suffix in r.suffixes},
                                  frozenset(r.fmt for r in _FORMATS.values() if r.compressible))
    return _TABLES[len(_FORMATS)]


def suffix_table() -> dict[str, str]:
    """File suffix -> format, from every reader's `suffixes` (detect, below)."""
    return _tables()[0]


def compressible() -> frozenset[str]:
    """Formats whose files may be compressed (streamed whole)."""
    return _tables()[1]


def detect(path: str, strict: bool = True) -> tuple[Format, str | None] | None:
    """(format, compression) of a file by its name; None (strict=False) for files that are not corpus.

    With strict=True an unknown suffix is plain text (binary content is caught when read). The
    suffixes are the readers' own (tpu_ray/prepare/readers/: each format's class names them).
    """
    name = path.lower().rsplit("/", 1)[-1]
    compression = None
    for suffix, comp in COMPRESSIONS.items():
        if name.endswith(suffix):
            compression, name = comp, name[: -len(suffix)]
            break
    else:
        bad = next((s for s in UNSUPPORTED if name.endswith(s)), None)
        if bad:
            if not strict:
                return None
            raise UserError(f"{path}: compression/archive {bad!r} is not supported; decompress it, or recompress "
                            f"with gzip (.gz), zstd (.zst), bzip2 (.bz2) or xz (.xz)")
    for suffix, fmt in suffix_table().items():
        if name.endswith(suffix):
            if compression and fmt not in compressible():
                if not strict:
                    return None
                raise UserError(f"{path}: a compressed {suffix} file cannot be read in row groups; decompress it "
                                f"(parquet compresses its pages itself)")
            return fmt, compression  # type: ignore[return-value]
    if compression or strict:
        return "txt", compression  # e.g. `notes.gz`: compressed text
    return None
