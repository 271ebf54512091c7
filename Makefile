# edgefl: two commands on a fresh machine, `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test bench-quick robustness clean mosquitto iptables chromium

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

$(VENV)/.installed-bench: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $@

demo: $(VENV)/.installed mosquitto
	$(BIN)/edgefl demo --rounds 5 --out runs/demo

test: $(VENV)/.installed-test mosquitto chromium
	$(BIN)/python -m pytest

# The service tests start their own mosquitto; install Debian's when it is missing.
mosquitto:
	@command -v mosquitto >/dev/null || test -x /usr/sbin/mosquitto || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto; }

# The dashboard test opens the page in Debian's headless chromium (through playwright).
chromium:
	@test -x /usr/bin/chromium || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# The fault bench drops a gateway's packets with iptables inside its network namespace.
iptables:
	@command -v iptables >/dev/null || test -x /usr/sbin/iptables || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables; }

# Attacks, fuzzing (atheris) and network faults: bench/results/robustness.{json,md,png}; needs root.
robustness: $(VENV)/.installed-bench mosquitto iptables
	$(BIN)/python bench/robustness.py --quick

bench-quick: $(VENV)/.installed
	$(BIN)/python bench/fedqaper.py --quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
