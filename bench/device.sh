#!/bin/bash
# The checks that need a 16-core machine (issues 25, 27 and 29), prepared for a lent device,
# whose Python 3.12 has numpy, scipy, msgpack, pyarrow, tqdm and torch but no pyzmq, and which
# reaches no network:
#
#   here, once (pip reaches PyPI):    make device-wheels      # pyzmq, setuptools, threadpoolctl -> .whl/
#   there, through the device tool:   bash bench/device.sh PART   (carry: [".whl", ".cppkit"])
#
# PART (each fits one call of at most 10 minutes; the tool's timeout_s 600):
#   scale     bench/scale.py --workers 8 --size full: KGE, WV, MF on 8 x 1, 4 x 2 and 2 x 4
#             against the baseline's 1 x 8 (issue 25), then KGE's MRR after each epoch on
#             8 x 1 against 1 x 8 (issue 27); about 8 minutes
#   threads   bench/threads.py --threads 1,8: one node's worker threads (issue 29); about 5
#   cpp       MF on one node x 8 threads beside the original C++ AdaPM's MF app on the same
#             data, alternating (issue 29); about 3. The C++ AdaPM is not built by this
#             project: a kit built outside it (.cppkit/: its binaries, their libraries and a
#             run_mf.sh that runs one node; git-ignored) travels with the call. Without the
#             kit this part says so and does nothing.
#   channels  bench/scale.py --apps kge,wv --setups 2x4 --channels 1,2,4: a node of 4 workers
#             with its engine split over 1, 2 and 4 channels (issue 25 item 2); about 4
#   all       scale and threads, for a longer call
# Each table goes to $OUT (the device tool's folder that comes back; ./device-out elsewhere)
# as it is printed, so a part cut off by its timeout still returns what it finished.
# DEVICE_SMALL=1 runs the same steps on small data and 2 workers (to try the script here).
set -u
part=${1:-scale}
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
PY=${PY:-python3}
cd "$(dirname "$0")/.." || exit 1

if ls .whl/*.whl > /dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/adapm-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/adapm-site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# The native modules, built in place for this machine's Python (a rebuild changes nothing
# where they are newer than every native source).
newest=$(ls -t native/*.[ch] native/kernels/*.[ch] | head -1)
if [ -z "$(find adapm -maxdepth 1 -name '_native*.so' -newer "$newest")" ] \
    || [ -z "$(find adapm -maxdepth 1 -name '_kernels*.so' -newer "$newest")" ]; then
    $PY -c "from setuptools import setup; setup()" build_ext --inplace -j "$(nproc)" \
        > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
fi
{ echo "cores: $(nproc)"; $PY -c "import sys, numpy, zmq, torch, adapm; print('python', \
sys.version.split()[0], 'numpy', numpy.__version__, 'pyzmq', zmq.__version__, 'libzmq', \
zmq.zmq_version(), 'torch', torch.__version__, 'adapm', adapm.__version__)"; \
  git log -1 --format='commit %h %s' 2>/dev/null; } | tee "$out/machine.txt"

if [ "${DEVICE_SMALL:-0}" = 1 ]; then
    scale=(--workers 2 --size small --epochs 1)
    quality=(--kge-triples 20000 --kge-epochs 2 --kge-nodes 2)
    threads=(--quick --threads 1,2 --epochs 1)
    chsetups=2x1
else
    scale=(--workers 8 --size full --epochs 2)
    quality=(--kge-triples 1000000 --kge-epochs 3 --kge-nodes 8)
    threads=(--threads 1,8 --epochs 2)
    chsetups=2x4
fi
if [ "${DEVICE_SMALL:-0}" = 1 ]; then
    mf_gen=(--rows 20000 --cols 5000 --entries 2000000)
    cpp_threads=2
else
    mf_gen=(--rows 200000 --cols 50000 --entries 11000000) # bench/threads.py's full MF data
    cpp_threads=8
fi

run() { # run NAME SECONDS COMMAND...: its output into $out/NAME.txt, cut at SECONDS
    local name=$1 limit=$2
    shift 2
    echo "== $name: $* (at most ${limit}s)"
    timeout "$limit" "$@" > "$out/$name.txt" 2>&1
    local rc=$?
    grep -v '^ *[0-9.]* s  ' "$out/$name.txt" | tail -40
    echo "== $name: exit $rc"
}

if [ "$part" = scale ] || [ "$part" = all ]; then
    # Every data set at once (generation is one process each), then the runs one at a time.
    for app in kge wv mf; do
        $PY bench/scale.py "${scale[@]}" --apps $app --prepare > "$out/prepare-$app.log" 2>&1 &
    done
    wait
    run scale 330 $PY bench/scale.py "${scale[@]}"
    run quality 150 $PY bench/quality.py --per-epoch kge --seeds 1 "${quality[@]}"
fi
if [ "$part" = channels ]; then
    for app in kge wv; do
        $PY bench/scale.py "${scale[@]}" --apps $app --prepare > "$out/prepare-$app.log" 2>&1 &
    done
    wait
    run channels 420 $PY bench/scale.py "${scale[@]}" --apps kge,wv --setups "${chsetups}" \
        --channels 1,2,4
fi
if [ "$part" = threads ] || [ "$part" = all ]; then
    run threads 540 $PY bench/threads.py "${threads[@]}"
fi
if [ "$part" = cpp ]; then
    if [ ! -x .cppkit/run_mf.sh ]; then
        echo "== cpp: no .cppkit/run_mf.sh here (carry it with the call); nothing run"
        exit 0
    fi
    data=${TMPDIR:-/tmp}/adapm-bench-threads-mf-$(IFS=-; echo "${mf_gen[*]:1:1}-${mf_gen[*]:3:1}-${mf_gen[*]:5:1}")
    [ -f "$data/test.mmc" ] || $PY -m adapm.apps.mf generate "$data" "${mf_gen[@]}" --seed 1 \
        > "$out/prepare-cpp.log" 2>&1 || { tail -20 "$out/prepare-cpp.log"; exit 1; }
    mf=($PY -m adapm.apps.mf --train "$data/train.mmc" --test "$data/test.mmc" --epochs 3
        --progress off --seed 1 --json -)
    for round in 1 2; do
        run "cpp-$round" 200 .cppkit/run_mf.sh "$data" "$cpp_threads" 3
        run "adapm-$round" 120 "${mf[@]}" --workers "$cpp_threads"
        run "adapm-columnwise-$round" 120 "${mf[@]}" --workers "$cpp_threads" \
            --schedule columnwise
        run "baseline-$round" 120 "${mf[@]}" --baseline --workers "$cpp_threads"
    done
fi
