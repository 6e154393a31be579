# Everything a fresh machine needs: `make test` and `make demo` bootstrap .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv lint typecheck test demo bench clean

# Re-installs only when pyproject.toml changes; otherwise this is a no-op.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check operator tests examples
	$(BIN)/ruff format --check operator tests examples
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy operator/shadowpod
	$(BIN)/mypy examples/01-reference-agent

test: lint typecheck
	$(BIN)/pytest

# A live migration of an agent session under load, on this machine (no cluster).
demo: $(STAMP)
	$(BIN)/shadowpod demo

bench: $(STAMP)
	$(BIN)/shadowpod bench journal --json

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
