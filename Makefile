# edgefl: two commands on a fresh machine, `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo docs test bench-quick robustness clean mosquitto iptables chromium neurobench lava-venv arm-check \
	python-versions wheels

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Every role (pyproject.toml's `all` extra: gateway, coordinator, export, the bundled sites); a
# gateway installs only its own: pip install 'edgefl[serve]' or 'edgefl[gateway]' (docs/notes/roles.md).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[all]'
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

$(VENV)/.installed-bench: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $@

demo: $(VENV)/.installed mosquitto
	$(BIN)/edgefl demo --rounds 5 --out runs/demo

# The documentation site (mkdocs-material comes with the test extra), built strictly into site/.
docs: $(VENV)/.installed-test
	$(BIN)/python -m mkdocs build --strict --site-dir site

# Two workers, a test file each at a time (pytest-xdist), the files that start a broker first
# (tests/conftest.py): the service tests wait on deadlines and child processes most of their time,
# so a second file runs beside them. On one idle 2-core machine, one day: 18.1 min serial, 14.2 min
# on two workers, 13.2 min with the broker files first (a fresh clone's `make test`).
test: $(VENV)/.installed-test mosquitto chromium neurobench
	$(BIN)/python -m pytest -n 2 --dist loadfile

# NeuroBench cross-checks our operation counts (tests/test_neurobench.py, export/crosscheck.py).
# Installed without its declared dependencies: its metrics need only torch and snntorch (ours) and
# tqdm, while its requirements would add torchaudio, numba, tonic and librosa for datasets we never load.
NEUROBENCH := neurobench==2.3.0 tqdm==4.70.1
neurobench: $(VENV)/.installed
	@$(BIN)/python -c "import neurobench, tqdm" 2>/dev/null || $(BIN)/pip install --quiet --no-deps $(NEUROBENCH)

# Lava's own netx loader and fixed-point simulator in a separate Python 3.11 venv (minutes, once;
# needs PyPI): every Lava release declares python<3.11, so it cannot be an extra of ours.
lava-venv:
	PYTHON=$(PYTHON) tools/lava/build_venv.sh .lava-venv
# Then: edgefl export lava ... --verify-in-lava (Lava's spikes vs ours, layer by layer; README).

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

# Other Pythons and CPUs (docs/notes/pythons.md). Debian 13 root filesystems made once with mmdebstrap
# (arm64 under qemu-user-static) and cached in $EDGEFL_ROOTFS_CACHE (/var/cache/edgefl-rootfs); root.
# arm-check: `edgefl agent serve` on linux/aarch64 publishes a forecast (bench/results/arm_check.json).
arm-check: $(VENV)/.installed mosquitto
	$(BIN)/python tools/platforms/arm_check.py

# The serve and gateway tests on Python 3.11, 3.12 and 3.13 (bench/results/python_versions.json).
python-versions: $(VENV)/.installed-test mosquitto
	$(BIN)/python tools/platforms/python_versions.py

# Which wheels each requirement set installs on Python 3.11-3.13, x86_64 and aarch64 (bench/results/wheels.json).
wheels: $(VENV)/.installed
	$(BIN)/python tools/platforms/wheels.py

bench-quick: $(VENV)/.installed
	$(BIN)/python bench/fedqaper.py --quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
