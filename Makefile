# pardiag: `make demo` and `make test` set everything up from scratch in .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.pardiag-installed
LINKED := $(VENV)/.pardiag-linked
# The editable install is static (setuptools' strict mode): it links every file of the package
# into build/__editable__.*/ and puts that folder on sys.path with a .pth file, so `import
# pardiag` works wherever Python starts (also in the folder that holds a clone named pardiag) and
# static tools follow the package. A file added or removed is linked again by `make setup`.
STRICT := --config-settings editable_mode=strict
FILES  := find pardiag analyzer collectors -type f \( -name '*.py' -o -name '*.css' -o -name '*.js' \
	-o -name '*.html' \) | LC_ALL=C sort

.PHONY: demo test lint setup links browser clean

setup: links

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
	$(PY) -m pip install -q -e ".[test]" $(STRICT)
	@$(FILES) > $(LINKED)
	@touch $(STAMP)

# Links the package's files again when the set of files changed since they were linked.
links: $(STAMP)
	@$(FILES) > $(LINKED).new
	@if cmp -s $(LINKED).new $(LINKED); then rm -f $(LINKED).new; else \
		echo "linking the package's files into the editable install"; \
		$(PY) -m pip install -q --no-deps -e . $(STRICT) && mv $(LINKED).new $(LINKED); fi

demo: links
	$(VENV)/bin/pardiag report sample_traces/pp_before_cpu_2rank -o report.html --json summary.json
	$(VENV)/bin/pardiag compare sample_traces/pp_before_cpu_2rank sample_traces/pp_after_cpu_2rank \
		-o compare.html --json compare.json -q
	@echo "open report.html and compare.html in a browser"

# ruff (style and errors, pyproject.toml [tool.ruff]), import-linter (the analyzer's stage
# order and the other import contracts, [tool.importlinter]) and mypy (types, [tool.mypy]).
# import-linter runs from inside .venv: in the checkout, Python would find the package face
# pardiag/ before the linked package. mypy checks the linked package under its installed names
# (the analyzer and every module of pardiag/; not the collectors, which run inside torch):
# MYPYPATH puts the editable install's folder first, so pardiag.analyzer is analyzer/.
MYPY_MODULES := -m pardiag -p pardiag.analyzer \
	$(patsubst pardiag/%.py,-m pardiag.%,$(filter-out pardiag/__init__.py,$(wildcard pardiag/*.py)))
lint: links
	$(VENV)/bin/ruff check .
	cd $(VENV) && bin/lint-imports ../pyproject.toml --no-cache
	MYPYPATH=$$(ls -d build/__editable__.*-py3-none-any) $(VENV)/bin/mypy $(MYPY_MODULES)

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

# Two workers, whole test files each (pyproject.toml's addopts).
test: lint browser
	$(PY) -m pytest

clean:
	rm -rf $(VENV) build report.html summary.json compare.html compare.json
