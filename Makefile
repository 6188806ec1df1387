# The two set-up commands are `make run` and `make test`; everything else is optional.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint pytest model bench screenshots package package-test gpu clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall when the project's metadata or native sources change. llama-cpp-python builds
# from source the first time (~11 min on 2 cores); pip's wheel cache makes later installs fast.
$(STAMP): $(PY) pyproject.toml setup.py $(wildcard native/*.c native/*.h)
	$(PY) -m pip install --upgrade --quiet pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

model: $(STAMP)
	$(PY) -m runtime.default_model

run: $(STAMP) model
	$(VENV)/bin/outrider

lint: $(STAMP)
	$(VENV)/bin/ruff check runtime app tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

pytest: $(STAMP) model
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest $(PYTEST_ARGS)

test: lint pytest

bench: $(STAMP) model
	@echo "see benchmarks/README.md: each script takes the llama.cpp tool paths it compares against"

# Under Xvfb when it is installed (apt-get install xvfb), so no display is needed.
screenshots: $(STAMP) model
	$(if $(shell command -v xvfb-run),xvfb-run -a -s "-screen 0 1400x900x24") $(PY) -m app.screenshots docs/screenshots

package: $(STAMP)
	$(PY) -m pip install --quiet 'pyinstaller>=6.10'
	$(VENV)/bin/pyinstaller --noconfirm --distpath dist --workpath build/pyinstaller packaging/outrider.spec

package-test: package
	QT_QPA_PLATFORM=offscreen dist/Outrider/Outrider --self-test

# Rebuild llama-cpp-python for this machine's GPU (CUDA if nvcc is found, Metal on macOS).
gpu: $(STAMP)
	bash packaging/rebuild-llama-gpu.sh $(PY)

clean:
	rm -rf build dist *.egg-info
