# The two set-up commands are `make run` and `make test`; everything else is optional.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint pytest model bench screenshots package package-test gpu clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall when the project's metadata or native sources change. llama-cpp-python builds
# from source the first time (~11 min on 2 cores), with llama.cpp's RPC backend and any
# CMAKE_ARGS, into a wheel folder keyed on those flags (packaging/llama_wheel.py says why);
# later installs take seconds.
$(STAMP): $(PY) pyproject.toml setup.py packaging/llama_wheel.py $(wildcard native/*.c native/*.h)
	$(PY) -m pip install --upgrade --quiet pip setuptools wheel
	$(PY) packaging/llama_wheel.py
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

model: $(STAMP)
	$(PY) -m runtime.library.default_model

run: $(STAMP) model
	$(VENV)/bin/outrider

lint: $(STAMP)
	$(VENV)/bin/ruff check runtime app tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The GUI tests run one file per process: each file opens many windows with their own
# threads and engine processes, and a fresh process keeps one file's leftovers (a late
# deferred delete, a thread's last queued signal) from ever landing in another file's test.
# A run that hangs is stopped with SIGABRT, on which pytest's faulthandler prints every
# thread's stack, so a hang fails in minutes and says where (pytest-timeout's SIGALRM can miss
# a main thread blocked in C). The suite takes ~5 min on 2 cores, a GUI file under 30 s. The
# engine tests then run again on the pure-Python decode step (runtime.engine.native_step).
# First, in seconds, every docstring example of runtime/ runs (--doctest-modules on runtime
# only: testpaths stays tests/, so nothing runs twice, and app/ and tests/ are not imported).
LIMIT = $(if $(shell command -v timeout),timeout -s ABRT $(1))
pytest: $(STAMP) model
	@echo "== docstring examples of runtime/ (pytest --doctest-modules runtime)"
	$(call LIMIT,300) $(PY) -m pytest -q -p no:cacheprovider --doctest-modules runtime
	QT_QPA_PLATFORM=offscreen $(call LIMIT,1800) $(PY) -m pytest --ignore=tests/gui $(PYTEST_ARGS)
	@echo "== tests/engine on the Python step (OUTRIDER_NATIVE_STEP=0: the native step's reference)"
	OUTRIDER_NATIVE_STEP=0 $(call LIMIT,1200) $(PY) -m pytest -q -p no:cacheprovider tests/engine $(PYTEST_ARGS)
	@for f in tests/gui/test_*.py; do \
	  echo "== $$f"; \
	  QT_QPA_PLATFORM=offscreen $(call LIMIT,300) $(PY) -m pytest -q -p no:cacheprovider $$f $(PYTEST_ARGS) \
	    || exit 1; \
	done

test: lint pytest

bench: $(STAMP) model
	@cat benchmarks/README.md

# Under Xvfb when it is installed (apt-get install xvfb), else Qt's offscreen platform: no
# display is needed either way. Every page at 1024x700 and 1920x1080, into docs/screenshots/.
screenshots: $(STAMP) model
	$(if $(shell command -v xvfb-run),xvfb-run -a -s "-screen 0 2000x1200x24",QT_QPA_PLATFORM=offscreen) $(PY) -m app.screenshots docs/screenshots

# The one-folder app for this OS (packaging/README.md): dist/Outrider/, plus a tarball on
# Linux and a zipped Outrider.app on macOS. The icons are kept in git; redrawn when the SVG changes.
VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' runtime/__init__.py)
ICONS := packaging/icons/outrider-512.png

$(ICONS): packaging/icons/outrider.svg packaging/make_icons.py | $(STAMP)
	QT_QPA_PLATFORM=offscreen $(PY) packaging/make_icons.py
	touch $@

# After PyInstaller, the bundle checks itself (packaging/check_bundle.py): every module of
# runtime/ and app/ imports, every dependency has its metadata and data files. Any problem
# is printed and fails the build before the archive is made.
package: $(STAMP) $(ICONS)
	$(PY) -m pip install --quiet 'pyinstaller>=6.10'
	$(VENV)/bin/pyinstaller --noconfirm --distpath dist --workpath build/pyinstaller packaging/outrider.spec
	QT_QPA_PLATFORM=offscreen dist/Outrider/Outrider --check-bundle
	@case "$$(uname -s)" in \
	  Linux) tar -C dist -czf dist/Outrider-$(VERSION)-linux-$$(uname -m).tar.gz Outrider ;; \
	  Darwin) ditto -c -k --keepParent dist/Outrider.app dist/Outrider-$(VERSION)-macos-$$(uname -m).zip ;; \
	esac
	@du -sh dist/Outrider dist/Outrider-$(VERSION)-* 2>/dev/null || true

# Not part of `make test` (the build takes minutes): the frozen app's self-test (engine from
# itself, load, generate, window), tests/packaging (a bundle missing a dependency's metadata
# fails the check) and the frozen server's structured output and tool calls
# (packaging/package_test.sh says what each step does).
package-test: package model
	PY=$(PY) bash packaging/package_test.sh

# Rebuild llama-cpp-python for this machine's GPU (CUDA if nvcc is found, Metal on macOS).
gpu: $(STAMP)
	bash packaging/rebuild-llama-gpu.sh $(PY)

clean:
	rm -rf build dist *.egg-info
