#!/usr/bin/env bash
# What a short GPU lease should run, as one command from the repository root:
#
#   bash benchmarks/gpu_lease.sh [SECONDS] [OUT_DIR]      # defaults: 540, $OUT or benchmarks/results/gpu
#   MODES=eager,cuda-graphs TESTS=1 bash benchmarks/gpu_lease.sh 540
#
# - TESTS=1: pytest tests/compilation/test_cuda_steps.py first (every step mode's greedy output against transformers on the
#   GPU, CUDA graphs really replayed, one host sync per step); about 2 minutes each for the three non-graph and
#   the two cuda-graphs tests (benchmarks/results/gpu_h200/RUN.md).
# - TESTS=after: the session first, then only the cuda-graphs tests (-k cuda-graphs) in the time left, if at
#   least 100 s are (a lease whose main goal is the session's numbers).
# - PAGED=1: benchmarks/paged_attention_gpu.py next (one decode step's attention, the paged kernel against gather +
#   SDPA, side by side; at most 120 s), into OUT_DIR/paged_attention.json.
# - then benchmarks/gpu_session.py for MODES (default cuda-graphs: eager was measured on an H200, see
#   benchmarks/results/gpu_h200/RUN.md), with a deadline that leaves the last part 100 s, killed (SIGTERM, which
#   gpu_session.py turns into a record of where its time went) at SECONDS.
# - GRAPHS=DIR (default OUT_DIR/graphs): the session's compiled graphs, stored there on the first run and loaded
#   by every later one that has the directory (graph_store.py), so a lease that carries it measures, not compiles.
# The package is imported from the checkout through PYTHONPATH (its layout is the installed one, plugins/ inside
# trtllm_dflash/), so nothing needs installing; pytest runs as `python3 -P -m pytest`.
set -u
seconds=${1:-540}
out=${2:-${OUT:-benchmarks/results/gpu}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
left() { echo $((seconds - ($(date +%s) - start))); }
nvidia-smi -L
python3 -P -c "import torch, transformers, trtllm_dflash.plugins.context_kv as kv
print('torch', torch.__version__, 'transformers', transformers.__version__, 'trtllm_dflash from', kv.__file__)" || exit 1
if [ "${TESTS:-0}" = 1 ]; then
    timeout $(($(left) / 2)) python3 -P -m pytest -q -p no:cacheprovider -W ignore::UserWarning tests/compilation/test_cuda_steps.py \
        >"$out/tests_cuda_steps.log" 2>&1
    echo "tests/compilation/test_cuda_steps.py: exit $? after $(($(date +%s) - start)) s"
    tail -3 "$out/tests_cuda_steps.log"
fi
if [ "${PAGED:-0}" = 1 ]; then
    timeout 120 python3 benchmarks/paged_attention_gpu.py --output "$out/paged_attention.json" >"$out/paged_attention.log" 2>&1
    echo "benchmarks/paged_attention_gpu.py: exit $? after $(($(date +%s) - start)) s"
    tail -5 "$out/paged_attention.log"
fi
budget=$(left)
TORCH_LOGS=recompiles timeout "$budget" python3 benchmarks/gpu_session.py --out "$out" --step-modes "${MODES:-cuda-graphs}" \
    --deadline-s $((budget - 100)) --graphs "${GRAPHS:-$out/graphs}" >"$out/session.log" 2>&1
echo "gpu_session.py: exit $? after $(($(date +%s) - start)) s"
tail -40 "$out/session.log"
if [ "${TESTS:-0}" = after ] && [ "$(left)" -ge 100 ]; then
    timeout $(($(left) - 5)) python3 -P -m pytest -q -p no:cacheprovider -W ignore::UserWarning -k cuda-graphs \
        tests/compilation/test_cuda_steps.py >"$out/tests_cuda_graphs.log" 2>&1
    echo "tests/compilation/test_cuda_steps.py -k cuda-graphs: exit $? after $(($(date +%s) - start)) s"
    tail -3 "$out/tests_cuda_graphs.log"
fi
