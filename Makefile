# pynvmf: `make run` sets up and runs the target on its in-memory default;
# `make test` sets up (Debian packages included) and runs the whole test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: run test setup system-deps lint bench fuzz clean compiled clean-compiled blktests

$(BIN)/.installed: pyproject.toml
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || bash scripts/install-system-deps.sh --python
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	PYNVMF_PURE=1 $(BIN)/pip install -q -e '.[test]'
	touch $@

# The optional RBD backend's bindings (Debian's python3-rados/python3-rbd), when installed.
setup: $(BIN)/.installed
	@$(BIN)/python scripts/link-ceph-bindings.py

# The compiled build where it can be made (a C compiler), pure Python otherwise; the
# target's first line says which runs.
run: setup
	$(MAKE) compiled || { $(MAKE) clean-compiled; echo "pynvmf: no compiled build here: running pure Python (slower)"; }
	$(BIN)/pynvmf target $(ARGS)

system-deps:
	bash scripts/install-system-deps.sh

# PLC2701 (a preview rule, so run alone): no module imports another module's private name.
lint: setup
	$(BIN)/ruff check pynvmf tests benchmarks
	$(BIN)/ruff check --preview --select PLC2701 pynvmf tests benchmarks scripts contrib

# The whole suite on the pure-Python path, then the unit and protocol tests, the Linux
# hosts' main interoperability module and, for the compiled host library, the Linux
# kernel target's modules again with the hot modules compiled (docs/performance.md,
# "Compiled hot modules"). The compiled pass meets one peer, the newest: what can differ
# between the builds is the code's (mypyc's semantics), not the peer's. Those guest
# modules run on that peer in the compiled pass only (PYNVMF_GUEST_DEFERRED,
# tests/interop/conftest.py), on their other peers in the pure pass: each build meets a
# real host and target, and no module runs twice on one peer (tests/support/guest.py says
# which peer runs which module). `make test` has to stay under 40 minutes on 2 CPUs.
COMPILED_GUESTS := tests/interop/test_linux_host.py tests/interop/test_linux_target.py \
	tests/interop/test_linux_target_copy.py
COMPILED_TESTS := tests/unit tests/protocol $(COMPILED_GUESTS)
# Not again on the compiled build: modules whose subject is interpreted code only (the
# command line's typing and output, operator input, configuration sources, the live
# view), whose commands pass through the compiled modules just as the other modules' do
# (~2 minutes of the pass).
COMPILED_SKIP := tests/protocol/test_cli_as_typed.py tests/protocol/test_operator_input.py \
	tests/protocol/test_target_sources.py tests/protocol/test_bench_cli.py \
	tests/unit/test_bench_cli.py tests/protocol/test_top.py tests/protocol/test_cli.py \
	tests/protocol/test_controllers_cli.py
COMPILED_PEERS := linux-7
# Each pass in two parts: the tests that may run side by side on every CPU (pytest-xdist),
# then those that run alone (the `serial` marker: guests, rates; tests/conftest.py).
TEST_WORKERS ?= auto
PARALLEL = -m "not serial" -n $(TEST_WORKERS)
test: system-deps setup lint
	$(MAKE) clean-compiled
	$(BIN)/python -m pytest --durations=25 $(PARALLEL)
	PYNVMF_GUEST_DEFERRED="$(foreach m,$(COMPILED_GUESTS),$(m):$(COMPILED_PEERS))" \
		$(BIN)/python -m pytest --durations=25 -m serial
	$(MAKE) compiled
	PYNVMF_COMPILED=1 $(BIN)/python -m pytest --durations=25 $(PARALLEL) $(COMPILED_TESTS) \
		$(addprefix --ignore=,$(COMPILED_SKIP))
	PYNVMF_COMPILED=1 PYNVMF_GUEST_PEERS=$(COMPILED_PEERS) $(BIN)/python -m pytest --durations=25 \
		-m serial $(COMPILED_TESTS) $(addprefix --ignore=,$(COMPILED_SKIP))
	$(MAKE) clean-compiled

$(BIN)/.compiled-installed: $(BIN)/.installed pyproject.toml
	PYNVMF_PURE=1 $(BIN)/pip install -q -e '.[test,compiled]'
	touch $@

# The modules setup.py lists, compiled by mypyc from the same source, built as the wheel
# a user's `pip install .` builds (so that the suite tests that wheel's extensions), then
# unpacked next to their sources, where Python imports them instead of the .py files;
# tests run on that path only with PYNVMF_COMPILED=1 (tests/conftest.py).
# `make clean-compiled` returns the tree to pure Python. (The touch: a build whose
# generated C did not change relinks nothing, and the guard compares the extensions'
# times with their sources'.)
compiled: $(BIN)/.compiled-installed
	rm -rf build/wheel
	PYNVMF_MYPYC=1 $(BIN)/pip wheel -q --no-deps --no-build-isolation -w build/wheel .
	$(BIN)/python scripts/unpack-compiled.py build/wheel/pynvmf-*.whl
	find pynvmf -name '*.so' -exec touch {} +

clean-compiled:
	find pynvmf -name '*.so' -delete
	rm -rf build/mypyc build/lib.* build/temp.* build/bdist.* build/wheel

$(BIN)/.bench-installed: $(BIN)/.installed pyproject.toml
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $@

# Every benchmark in benchmarks/ (minutes; root for the network namespaces).
# `make bench ARGS=--quick` for a smoke run.
bench: $(BIN)/.bench-installed
	$(BIN)/python benchmarks/run_all.py $(ARGS)

$(BIN)/.fuzz-installed: $(BIN)/.installed pyproject.toml
	$(BIN)/pip install -q -e '.[test,fuzz]'
	touch $@

# Coverage-guided fuzzing of both transport ends (atheris / libFuzzer), FUZZ_RUNS inputs
# each, from the committed corpus (new interesting inputs are added to it).
FUZZ_RUNS ?= 1000000
fuzz: $(BIN)/.fuzz-installed
	PYTHONPATH=. $(BIN)/python tests/fuzz/run_atheris.py target -atheris_runs=$(FUZZ_RUNS) tests/fuzz/corpus/target
	PYTHONPATH=. $(BIN)/python tests/fuzz/run_atheris.py host -atheris_runs=$(FUZZ_RUNS) tests/fuzz/corpus/host

clean: clean-compiled
	rm -rf $(VENV) .pytest_cache .ruff_cache

# blktests' nvme group in a Linux guest against the guest kernel's nvmet and against
# pynvmf (tests/blktests/run.py; not part of `make test`: hours under TCG). blktests is in
# no archive this project installs from: BLKTESTS_DIR names a checkout. ARGS: e.g.
# --tests nvme/041,nvme/062 --targets pynvmf --notes docs/blktests-notes.json
BLKTESTS_DIR ?=
blktests: setup
	BLKTESTS_DIR=$(BLKTESTS_DIR) $(BIN)/python -m tests.blktests.run $(ARGS)
