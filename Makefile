# pardiag: `make demo` and `make test` set everything up from scratch in .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.pardiag-installed

.PHONY: demo test setup browser clean

setup: $(STAMP)

# The venv sees the system site-packages so an already installed torch (for example a CUDA
# build) is reused; torch 2.13.0 (CPU build) is installed only when no torch is importable.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "torch found: $$($(PY) -c 'import torch; print(torch.__version__)') (kept)"; \
	else \
		echo "no torch importable: installing torch==2.13.0"; \
		$(PY) -m pip install -q torch==2.13.0; \
	fi
	$(PY) -m pip install -q -e ".[test]"
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/pardiag report sample_traces/pp_unbalanced_cpu_2rank -o report.html --json summary.json
	$(VENV)/bin/pardiag compare sample_traces/pp_before_cpu_2rank sample_traces/pp_after_cpu_2rank \
		-o compare.html --json compare.json -q
	@echo "open report.html and compare.html in a browser"

# The browser tests (tests/test_browser.py) drive Debian's chromium through Playwright (from the
# test extra; it downloads no browser of its own). As root with apt, a missing chromium is
# installed; otherwise those tests skip (and fail under CI=true).
browser:
	@if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt) for the browser tests"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
			|| echo "apt-get could not install chromium: the browser tests will say so"; \
	else \
		echo "no chromium and no apt as root: the browser tests will be skipped"; \
	fi

# Two workers, whole test files each (module fixtures hold profiled runs): the profiled runs'
# start-up and waits overlap the analysis tests on a 2-core machine.
test: $(STAMP) browser
	$(PY) -m pytest -n 2 --dist loadfile

clean:
	rm -rf $(VENV) report.html summary.json compare.html compare.json
