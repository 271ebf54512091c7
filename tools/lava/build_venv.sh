#!/usr/bin/env bash
# Build the separate Python 3.11 venv in which Lava's own netx loader checks our netx files
# (`make lava-venv`). Every Lava release declares python<3.11 and lava-dl 0.6.0 pins torch<2.4,
# so both are installed without their declared dependencies, then the runtime packages they
# really import, then two local fixes (see patch_lava.py). Runs once; re-running is a no-op.
set -euo pipefail
VENV=${1:-.lava-venv}
PYTHON=${PYTHON:-python3.11}
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -f "$VENV/.built" ]; then echo "$VENV is ready"; exit 0; fi
$PYTHON -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet --no-deps --ignore-requires-python lava-nc==0.10.0 lava-dl==0.6.0
# The versions verified together (lava-nc wants numpy<2, networkx<=2.8.7, asteval<0.10; numpy 2.4 works).
"$VENV/bin/pip" install --quiet numpy==2.4.6 scipy==1.17.1 scikit-learn==1.9.1 networkx==2.8.7 asteval==0.9.33 \
    h5py==3.16.0 matplotlib==3.11.2 torch==2.13.0
"$VENV/bin/python" "$HERE/patch_lava.py"
touch "$VENV/.built"
echo "built $VENV: lava-nc 0.10.0 + lava-dl 0.6.0 on $("$VENV/bin/python" --version)"
