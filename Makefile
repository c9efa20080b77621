# One command sets up and runs the tests on a fresh machine: `make test` (what .ci/run calls).
#   1. .venv with tpu-ray and its test extra, once (again when pyproject.toml changes): `python3 -m venv`,
#      then uv (from PyPI, into the venv) installs -e ".[test]": the same packages pip would, in seconds;
#      tests/compile_bytecode.sh compiles them to bytecode as pip does (uv does not unless told, and
#      its --compile-bytecode failed intermittently): where PYTHONDONTWRITEBYTECODE is set, as on
#      this project's machines, every process otherwise compiled TensorFlow again, 12.6 s a time;
#   2. Chromium for the browser test: apt-get where it can (root and apt-get present), else the test
#      skips, saying why (with TPU_RAY_REQUIRE_EXTRAS=1, as CI sets, a missing Chromium fails here);
#   3. the PyTorch interop venvs (.venv-interop/, tests/interop/setup_venvs.sh, ~1 GB linked from uv's
#      cache), once: where they cannot be built (no network) their tests skip, saying why (with
#      TPU_RAY_REQUIRE_EXTRAS=1: fail); a failed build removes only the venvs it makes (t4, t5);
#   4. the default suite, then the slow set, each a pytest run on $(JOBS) workers (pytest-xdist: a
#      file's tests stay on one worker, so its module fixtures are made once; tests/timing.py groups
#      them and starts the longest first). Two runs, not one: a failing default suite stops here
#      before the slow set starts, and one run was no faster (a fresh clone's make test: 29 min 30 s
#      with one, 29 min 10 s with two). Tests that run Ray Train in the driver or build their own
#      multi-node Ray cluster run in fresh processes (@pytest.mark.own_process, tests/own_process.py:
#      after those, a Ray 2.60 driver stopped hearing from its actors, twice, or died on a
#      reference-counter check);
#   5. the TPU package set (make tpu-set): the TPU-shaped tests again, on the [tpu] extra's TensorFlow
#      version as the CPU wheel (tests/tpu_set/run.sh, .venv-tpu-set).
# Any failing step or test fails the command, "no tests collected" (pytest's exit 5) included.
# Tiers: make test-quick (no training, no Ray: ~1 min), make test-fast (the default suite, no slow
# tests), make test (everything: what CI runs). make durations: make test, measured into
# docs/testing.md's table. Parts: make setup (1), make extras (2, 3).

PYTHON ?= python3
VENV ?= .venv
# The interop venvs go where the tests look for them (TPU_RAY_INTEROP_VENVS, else .venv-interop).
INTEROP ?= $(or $(TPU_RAY_INTEROP_VENVS),.venv-interop)
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
# Two workers: this project's machines (and CI's) have 2 cores. JOBS=1 runs in one process.
JOBS ?= 2
XDIST := $(if $(filter 1,$(JOBS)),-p no:xdist,-n $(JOBS) --dist loadgroup)

.PHONY: test test-fast test-quick durations setup extras browser interop

test: setup extras
	$(PY) -m pytest $(XDIST)
	$(PY) -m pytest $(XDIST) -m slow
	$(MAKE) tpu-set

test-fast: setup
	$(PY) -m pytest $(XDIST)

test-quick: setup
	$(PY) -m pytest $(XDIST) -m quick

durations: setup extras
	mkdir -p build
	start=$$(date +%s); $(PY) -m pytest $(XDIST) --durations-json build/durations-default.json; rc=$$?; \
	$(PY) -m pytest $(XDIST) -m slow --durations-json build/durations-slow.json || rc=1; \
	secs=$$(( $$(date +%s) - start )); \
	$(PY) tests/durations_table.py build/durations-default.json build/durations-slow.json \
		--wall "the two pytest runs took $$((secs / 60)) min $$((secs % 60)) s"; \
	exit $$rc

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -x $(UV) || $(PY) -m pip install -q "uv>=0.9"
	VIRTUAL_ENV=$(VENV) $(UV) pip install -e ".[test]"
	tests/compile_bytecode.sh $(VENV)
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

# uv: the project venv's (step 1 installs it), else one on PATH.
$(INTEROP)/.built: tests/interop/setup_venvs.sh
	@uv=$(UV); test -x $$uv || uv=uv; \
	if PYTHON=$(PYTHON) UV=$$uv tests/interop/setup_venvs.sh $(INTEROP); then touch $@; \
	elif [ -n "$$TPU_RAY_REQUIRE_EXTRAS" ]; then \
		echo "make: tests/interop/setup_venvs.sh failed and TPU_RAY_REQUIRE_EXTRAS is set" >&2; exit 1; \
	else \
		rm -rf $(INTEROP)/t4 $(INTEROP)/t5; \
		echo "make: the interop venvs could not be built (network?): the PyTorch interop tests will skip"; \
	fi

# The TPU package set on CPU (issue 48): a venv with the [tpu] extra's TensorFlow as the CPU wheel, its
# tf-keras and transformers, running the TPU-shaped tests (tests/tpu_set/run.sh; uv builds the venv).
.PHONY: tpu-set
tpu-set: setup
	UV=$(UV) JOBS=$(JOBS) tests/tpu_set/run.sh
