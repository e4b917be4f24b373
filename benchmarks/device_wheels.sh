#!/usr/bin/env bash
# The wheels the device image lacks for the course's test files (platformdirs, ipywidgets,
# nbformat and what they need), for its Python 3.12, into .whl/ (git-ignored). Carry ".whl" in
# the device call: gpu_session.sh's env stage installs them (--target /tmp/site), so every GPU
# test file collects there (round 7's first call: 27 files did not, for want of these).
#   bash benchmarks/device_wheels.sh        (here, before the call; about 12 MB, 30 wheels)
set -euo pipefail
PY=${PY:-python3}
mkdir -p .whl
$PY -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
  platformdirs ipywidgets nbformat 2>&1 | grep -v "^WARNING: Location" || true
echo "$(ls .whl/*.whl | wc -l) wheels in .whl/ ($(du -sh .whl | cut -f1)): carry [\".whl\"]"
