#!/bin/bash
# The operator path on a GPU host, as docs/operations.md gives it: gpuctl from `pip install .`
# (wheels from the folders in $WHEELS, default .whl and .whlop, when the host has no index),
# doctor, instances with the CLI's units and checks, run-args, the daemon without and with the
# driver, module signing state. Raw output: docs/runs/h100-operator-install/.
# Usage: scripts/gpu-operator-check.sh > operator.txt 2>&1
set -x
cd "$(dirname "$0")/.."
python3 --version; uname -r
python3 -m venv --system-site-packages /tmp/op && /tmp/op/bin/pip install -q --no-index $(for w in ${WHEELS:-.whl .whlop}; do printf -- "--find-links %s " "$w"; done) . 2>&1 | tail -5
/tmp/op/bin/gpuctl --version
/tmp/op/bin/gpuctl doctor; echo "doctor rc=$?"
/tmp/op/bin/gpuctl instance create web --memory 8Gi; echo "create (no module) rc=$?"
/tmp/op/bin/gpuctl --state /tmp/st.json --kernel no instance create web --memory 8Gi --weight 3 --uid 1000 --mode 0660; echo rc=$?
/tmp/op/bin/gpuctl --state /tmp/st.json --kernel no instance create batch --memory 8 ; echo "bare rc=$?"
/tmp/op/bin/gpuctl --state /tmp/st.json --kernel no instance create batch --memory 4G --priority offline --min-share 10% --ceiling 5%; echo "minshare>ceiling rc=$?"
/tmp/op/bin/gpuctl --state /tmp/st.json --kernel no instance create batch --memory 4G --priority offline --min-share 5%; echo rc=$?
/tmp/op/bin/gpuctl --state /tmp/st.json --kernel no policy set fixed --period 20s --gpu 0; echo "period rc=$?"
/tmp/op/bin/gpuctl --state /tmp/st.json --kernel no policy set fixed --period 50ms --gpu 0; echo rc=$?
/tmp/op/bin/gpuctl --state /tmp/st.json --kernel no policy show
/tmp/op/bin/gpuctl --state /tmp/st.json --kernel no instance show batch
/tmp/op/bin/gpuctl --state /tmp/st.json --kernel no run-args web
cat /tmp/st.json
/tmp/op/bin/gpuctl --state /tmp/st.json --kernel no daemon --ctl /nonexistent --duration 1s; echo "daemon no driver rc=$?"
/tmp/op/bin/gpuctl --state /tmp/st.json --kernel no daemon --duration 2s --status-file /tmp/status.json -v 2>&1 | tail -5; echo "daemon rc=$?"
/tmp/op/bin/gpuctl --state /tmp/st.json --kernel no exporter --help | head -5
cat /sys/module/module/parameters/sig_enforce 2>&1; mokutil --sb-state 2>&1 | head -2
ls /lib/modules/$(uname -r)/build >/dev/null 2>&1 && { make -C /lib/modules/$(uname -r)/build M=$PWD modules -j16 >/tmp/kb.txt 2>&1; echo "module build rc=$?"; tail -3 /tmp/kb.txt; modinfo -p kmod/gpuslice.ko; } || echo "no headers for $(uname -r)"
