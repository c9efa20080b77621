# One command sets up and runs the tests on a fresh machine: `make test` (what .ci/run calls).
#   1. .venv with tpu-ray and its test extra (pip install -e ".[test]"), once (again when pyproject.toml changes);
#   2. Chromium for the browser test: apt-get where it can (root and apt-get present), else the test
#      skips, saying why (with TPU_RAY_REQUIRE_EXTRAS=1, as CI sets, a missing Chromium fails here);
#   3. the PyTorch interop venvs (.venv-interop/, tests/interop/setup_venvs.sh, 2.3 GB), once: where
#      they cannot be built (no network) their tests skip, saying why (with TPU_RAY_REQUIRE_EXTRAS=1: fail);
#      a failed build removes only the venvs it makes (t4, t5), never the rest of a directory given it;
#   4. the default suite (python -m pytest), then the slow set (python -m pytest -m slow).
# Any failing step or test fails the command, "no tests collected" (pytest's exit 5) included.
# Parts: make setup (1), make extras (2, 3), make test-fast (setup + the default suite only).

PYTHON ?= python3
VENV ?= .venv
# The interop venvs go where the tests look for them (TPU_RAY_INTEROP_VENVS, else .venv-interop).
INTEROP ?= $(or $(TPU_RAY_INTEROP_VENVS),.venv-interop)
PY := $(VENV)/bin/python

.PHONY: test test-fast setup extras browser interop

test: setup extras
	$(PY) -m pytest
	$(PY) -m pytest -m slow

test-fast: setup
	$(PY) -m pytest

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e ".[test]"
	touch $@

extras: browser interop

# The browser test looks for `chromium` (or `chromium-browser`) on PATH.
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
		echo "make: Chromium present: the browser test runs"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		DEBIAN_FRONTEND=noninteractive apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	elif [ -n "$$TPU_RAY_REQUIRE_EXTRAS" ]; then \
		echo "make: cannot install Chromium (needs root and apt-get) and TPU_RAY_REQUIRE_EXTRAS is set" >&2; exit 1; \
	else \
		echo "make: Chromium absent and not installable here (needs root and apt-get): the browser test will skip"; \
	fi

interop: $(INTEROP)/.built

$(INTEROP)/.built: tests/interop/setup_venvs.sh
	@if PYTHON=$(PYTHON) tests/interop/setup_venvs.sh $(INTEROP); then touch $@; \
	elif [ -n "$$TPU_RAY_REQUIRE_EXTRAS" ]; then \
		echo "make: tests/interop/setup_venvs.sh failed and TPU_RAY_REQUIRE_EXTRAS is set" >&2; exit 1; \
	else \
		rm -rf $(INTEROP)/t4 $(INTEROP)/t5; \
		echo "make: the interop venvs could not be built (network?): the PyTorch interop tests will skip"; \
	fi

# The TPU package set on CPU (issue 48): a venv with the [tpu] extra's TensorFlow as the CPU wheel, its
# tf-keras and transformers, running the TPU-shaped tests (tests/tpu_set/run.sh; uv builds the venv).
.PHONY: tpu-set
tpu-set:
	tests/tpu_set/run.sh
