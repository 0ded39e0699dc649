#!/usr/bin/env bash
# The GPU device check (issue 33; how a lent session runs it: docs/gpu.md). On the lent
# machine, in one call, inside 8 minutes:
#
#   1. install the wheels carried in .whl/ (tools/fetch_gpu_wheels.sh) into a local target;
#   2. build the C kernels in place (setup.py build_ext --inplace);
#   3. run the CUDA suite with GS_REQUIRE_CUDA=1 (tests/cuda, tests/test_transfer.py and the
#      CUDA test of tests/sample/test_dense_native.py), JUnit XML into $OUT/junit.xml;
#      meanwhile, in the background, make a ~2M-node synthetic graph and convert it;
#   4. one training epoch per node-classification scheme on the GPU through the trainer,
#      each beside its training loader alone at the trainer's thread count
#      (tools/gpu_report.py loader), megabatch's again at HierBatching's --reuse 2,
#      then tools/bench_loader.py at 1, 4, 8 and 16 threads,
#      one system a call, with what time is left;
#   5. $OUT/gpu.json (tools/gpu_report.py assemble), $OUT/gpu_check.log, and
#      $OUT/details.tar.gz (every stage's JSON).
#
# Every stage runs under `timeout`, cut to what the whole budget leaves; a stage that fails
# is recorded (stages.tsv, then gpu.json's "stages" and "errors") and the script goes on.
# Exit status: the test stage's (non-zero when a test failed, or pytest could not run),
# else 0.
#
#   tools/gpu_check.sh                     # $OUT from the device tool, else ./gpu_out
# Knobs (environment): PYTHON (python3), GS_GPU_BUDGET_S (465: the whole check),
# GS_GPU_NODES (2000000), GS_GPU_DEVICE (cuda), GS_GPU_WORK (/tmp/gs_gpu_check),
# GS_GPU_SITE (/tmp/site), GS_GPU_BENCH_THREADS (1,4,8,16), GS_GPU_SKIP_BENCH (0; 1: wheels,
# kernels and the suite only, about 4 minutes: a rerun after a fix), GS_GPU_STRICT_WARNINGS
# (0: the suite runs with -W default, warnings reported in the log rather than failing a
# test as `make test` makes them; 1: as `make test`).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/gpu_out}
PY=${PYTHON:-python3}
BUDGET=${GS_GPU_BUDGET_S:-465}
NODES=${GS_GPU_NODES:-2000000}
DEVICE=${GS_GPU_DEVICE:-cuda}
WORK=${GS_GPU_WORK:-/tmp/gs_gpu_check}
SITE=${GS_GPU_SITE:-/tmp/site}
THREADS=${GS_GPU_BENCH_THREADS:-1,4,8,16}
RESERVE=25   # seconds kept for the report
SCHEMES=(minibatch megabatch disk microbatch macrobatch)
declare -A SCHEME_ARGS=(
  [minibatch]=""
  [megabatch]="--buffer-partitions 4"
  [disk]="--buffer-partitions 4"
  [microbatch]="--micro-batches 4"
  [macrobatch]="--macro-batches 4"
)
export PYTHONUNBUFFERED=1

mkdir -p "$OUT"
rm -rf "$WORK"
mkdir -p "$WORK"
LOG=$OUT/gpu_check.log
: > "$LOG"
rm -f "$OUT/gpu.json" "$OUT/junit.xml" "$OUT/details.tar.gz"
T0=$(date +%s)

say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

# stage NAME LIMIT CMD...: CMD under `timeout` (the limit cut to what the budget leaves, less
# the report's reserve), output appended to the log, "name rc seconds limit" to stages.tsv.
stage() {
  local name=$1 limit=$2
  shift 2
  local avail=$(( $(left) - RESERVE ))
  (( avail < limit )) && limit=$avail
  if (( limit < 5 )); then
    say "stage $name: skipped, no time left"
    printf '%s\tskipped\t0\t0\n' "$name" >> "$WORK/stages.tsv"
    return 125
  fi
  say "stage $name (limit ${limit} s): $*"
  local start rc ms
  start=$(date +%s%N)
  timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf '%s\t%s\t%d.%03d\t%s\n' "$name" "$rc" $(( ms / 1000 )) $(( ms % 1000 )) "$limit" >> "$WORK/stages.tsv"
  say "stage $name: exit $rc after $(( ms / 1000 )) s"
  return $rc
}

say "gpu_check in $REPO; out $OUT; work $WORK; budget ${BUDGET} s; device $DEVICE; $(nproc) cores"

# 1. the card, and the wheels --------------------------------------------------------------
stage nvidia_smi 20 bash -c "nvidia-smi --query-gpu=name --format=csv,noheader > '$WORK/nvidia_smi.txt'; nvidia-smi"
if compgen -G ".whl/*.whl" > /dev/null; then
  stage install 90 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
else
  say "no .whl/ folder: run tools/fetch_gpu_wheels.sh here and carry .whl (docs/gpu.md)"
  printf 'install\tskipped\t0\t0\n' >> "$WORK/stages.tsv"
fi
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
stage imports 60 "$PY" -c "
import sys, numpy, torch, zarr, numcodecs, crc32c, pymetis, graphstore
print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__, 'cuda',
      torch.version.cuda, 'available', torch.cuda.is_available(), 'zarr', zarr.__version__, 'numcodecs',
      numcodecs.__version__, 'graphstore from', graphstore.__file__)"

# 2. the C kernels -------------------------------------------------------------------------
stage build 120 bash -c "'$PY' setup.py -q build_ext --inplace && '$PY' -c '
from graphstore.sample import native_available
assert native_available(), \"the DENSE kernel did not load\"
print(\"native DENSE kernel loaded\")'"

# 3. the CUDA suite, the graph made meanwhile ----------------------------------------------
STORE=$WORK/syn.gs
BENCH=1
[[ ${GS_GPU_SKIP_BENCH:-0} == 1 ]] && BENCH=0
(
  (( BENCH )) || exit 0
  LOG=$WORK/data.log  # its own log while the tests write theirs; appended to the main log after
  stage synthetic 120 "$PY" tools/make_synthetic.py --kind node --num-nodes "$NODES" --avg-degree 10 \
    --feature-dim 128 --num-classes 10 --layout npz --split 0.5,0.25,0.25 --unlabeled-fraction 0.8 \
    --communities 100 --locality 0.75 --seed 0 --no-progress --out "$WORK/syn" \
  && cp "$WORK/syn/synthetic.json" "$WORK/graph.json" \
  && stage convert 200 "$PY" -m graphstore convert "$WORK/syn" "$STORE" --partitions 16 --partitioner stream \
  && rm -rf "$WORK/syn"
) > /dev/null 2>&1 &
DATA_PID=$!

# -v: a line per test in the log, which the report counts when a timeout kills pytest before
# it writes its JUnit XML.
pytest_args=(-v -p no:cacheprovider -rfE --durations=20 --junitxml="$OUT/junit.xml")
[[ ${GS_GPU_STRICT_WARNINGS:-0} == 1 ]] || pytest_args+=(-W default)
"$PY" -c "import pytest_timeout" 2> /dev/null && pytest_args+=(--timeout=170)
stage tests 240 env GS_REQUIRE_CUDA=1 "$PY" -m pytest "${pytest_args[@]}" tests/cuda tests/test_transfer.py \
  "tests/sample/test_dense_native.py::test_native_refuses_a_cuda_graph_and_auto_uses_torch"
TESTS_RC=$?

wait "$DATA_PID"
cat "$WORK/data.log" >> "$LOG" 2> /dev/null

# 4. the benchmark: an epoch per scheme on the GPU, beside the loader alone ---------------
if (( ! BENCH )); then
  say "GS_GPU_SKIP_BENCH=1: no benchmark"
elif [[ -d $STORE ]]; then
  for scheme in "${SCHEMES[@]}"; do
    # shellcheck disable=SC2086  # the scheme's options are words
    stage "train_$scheme" 75 "$PY" trainers/node_classification.py --store "$STORE" --device "$DEVICE" \
      --scheme "$scheme" ${SCHEME_ARGS[$scheme]} --epochs 1 --fanouts 10,5 --batch-size 1000 --hidden 256 \
      --dropout 0 --seed 0 --eval-scheme minibatch --eval-fanouts 10,5 --eval-batch-size 4096 \
      --metrics-out "$WORK/train_$scheme.json"
    if [[ -f $WORK/train_$scheme.json ]]; then
      stage "loader_$scheme" 45 "$PY" tools/gpu_report.py loader --from-metrics "$WORK/train_$scheme.json" \
        --json "$WORK/loader_$scheme.json"
    fi
  done
  # Megabatch trains each mega-batch once by default (measured on CPUs, where the step is
  # the epoch); HierBatching's second pass costs little where the loader is the epoch. The
  # same epoch at --reuse 2, for the report's "reuse" (its epoch over reuse 1's).
  # shellcheck disable=SC2086
  stage train_megabatch_reuse2 75 "$PY" trainers/node_classification.py --store "$STORE" --device "$DEVICE" \
    --scheme megabatch ${SCHEME_ARGS[megabatch]} --reuse 2 --epochs 1 --fanouts 10,5 --batch-size 1000 \
    --hidden 256 --dropout 0 --seed 0 --eval-scheme minibatch --eval-fanouts 10,5 --eval-batch-size 4096 \
    --metrics-out "$WORK/train_megabatch_reuse2.json"
  if [[ -f tools/bench_loader.py ]]; then
    # One system a call, so a timeout loses one system's rows, not all (it writes at the end).
    mode=(--no-drop-caches --targets 20000 --dd-mib 256)
    for system in graphstore-memory graphstore-megabatch graphstore-disk graphstore-macrobatch; do
      stage "bench_loader_${system#graphstore-}" 60 "$PY" tools/bench_loader.py --store "$STORE" \
        --threads "$THREADS" --json "$WORK/bench_loader_${system#graphstore-}.json" --systems "$system" "${mode[@]}"
      if [[ $? == 2 && ${mode[0]} != --quick ]]; then  # a usage error (no memory cap to enforce, say)
        mode=(--quick)
        stage "bench_loader_${system#graphstore-}_quick" 60 "$PY" tools/bench_loader.py --store "$STORE" \
          --threads "$THREADS" --json "$WORK/bench_loader_${system#graphstore-}.json" --systems "$system" --quick
      fi
    done
  else
    say "tools/bench_loader.py is not in this checkout: no thread sweep"
    printf 'bench_loader\tskipped\t0\t0\n' >> "$WORK/stages.tsv"
  fi
else
  say "no store at $STORE (see the synthetic and convert stages): no benchmark"
fi

# 5. the record ----------------------------------------------------------------------------
RESERVE=0
stage report 20 "$PY" tools/gpu_report.py assemble --work "$WORK" --out "$OUT"
sed -n '/^gpu.json: /,/^\[/p' "$LOG" | grep -v '^\[' || true  # the summary, for the reply's tail
(cd "$WORK" && tar czf "$OUT/details.tar.gz" --ignore-failed-read stages.tsv graph.json nvidia_smi.txt \
  train_*.json loader_*.json bench_loader_*.json 2> /dev/null)
say "done in $(( $(date +%s) - T0 )) s; tests stage exit $TESTS_RC"
exit "$TESTS_RC"
