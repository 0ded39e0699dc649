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
NATIVE_SRC := setup.py graphstore/sample/_native/dense.c graphstore/buffer/_native/csc.c \
	graphstore/layout/_native/rowsets.c graphstore/layout/_native/edges.c \
	graphstore/layout/_native/partition.c
# The pyg and dgl extras (graphstore.interop), pinned to what runs with torch 2.13.0 here:
# dgl 2.x needs torch <= 2.2. dgl 1.1.3 also needs setuptools<70, which torch's metadata
# refuses (it asks for >=77), so it is installed last, after everything that could upgrade
# it back; pip then warns about the conflict, and both run.
INTEROP_SPEC ?= torch_geometric==2.8.1 dgl==1.1.3 packaging==26.3
DGL_SETUPTOOLS ?= setuptools==69.5.1

.PHONY: demo test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile $(NATIVE_SRC)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test,pyg,dgl]" $(INTEROP_SPEC)
	$(PY) -m pip install --quiet "$(DGL_SETUPTOOLS)"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) tools/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo_out graphstore/sample/_native/_dense*.so graphstore/buffer/_native/_csc*.so \
	graphstore/layout/_native/_rowsets*.so graphstore/layout/_native/_edges*.so \
	graphstore/layout/_native/_partition*.so
