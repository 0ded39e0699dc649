# Two commands for a new user:  make demo  (convert + verify + summarise Cora)  and  make test.
# Each creates .venv when missing and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# CPU build of torch for machines without a GPU (a plain `torch` pulls a CUDA build of
# several GB). Override with `make TORCH_SPEC=torch` on a GPU machine.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# The compiled kernels are built by `pip install` (setup.py); editing their sources must
# rebuild it, so the stamp depends on it too.
NATIVE_SRC := setup.py graphstore/sample/_native/dense.c graphstore/buffer/_native/csc.c

.PHONY: demo test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile $(NATIVE_SRC)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) tools/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo_out graphstore/sample/_native/_dense*.so graphstore/buffer/_native/_csc*.so
