"""Rebuild docs/options.md from the CLI parser and the config schema: `python docs/make_options.py`.

A script beside the page, not a library module, because the library never imports the CLI."""

from pathlib import Path

from tpu_ray.cli import build_parser
from tpu_ray.options_doc import render

if __name__ == "__main__":
    page = Path(__file__).with_name("options.md")
    page.write_text(render(build_parser()))
    print(f"wrote {page}")
