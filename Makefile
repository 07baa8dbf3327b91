# The two set-up commands of the README. Both create .venv and install the project with
# its pinned dependency ranges on first use (nothing else needs to be installed).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Where torch and torchvision come from for `make test` (the `images` extra). Empty: pip's
# own choice (on Linux x86_64 the CUDA build); a CPU-only machine saves several GB with
# TORCH_INDEX=https://download.pytorch.org/whl/cpu (its 2.x.y+cpu wheels rank above 2.x.y).
TORCH_INDEX ?=

.PHONY: run test lint bench

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# The tests also need the `images` extra (torch, torchvision: mmdtl2 extract).
$(BIN)/.installed-images: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet -e '.[dev,images]' \
		$(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	touch $@

# The main job: the bundled Office-Caltech10 study (12 shifts x 20 splits, every method).
run: $(BIN)/.installed
	$(BIN)/mmdtl2 study run studies/office_caltech10.toml --num-cpus 2

# The whole test suite (real local Ray clusters, SQLite MLflow stores, Zarr on disk).
test: $(BIN)/.installed-images
	PATH="$(abspath $(BIN)):$$PATH" OMP_NUM_THREADS=1 $(BIN)/python -m pytest

# Style, and the import contracts of pyproject.toml (which package may import which).
lint: $(BIN)/.installed
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports --no-cache

# The quick subset of the computation-time benchmarks (< 5 min; benchmarks/results/).
bench: $(BIN)/.installed
	$(BIN)/python benchmarks/bench_scale.py --preset quick
