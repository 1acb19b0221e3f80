#!/usr/bin/env bash
# The one prepared script for a lent NVIDIA GPU (an H200): every GPU check, each figure printed.
#   bash bench/gpu_check.sh          (from anywhere; about 5 minutes, most of it model writing and JIT)
# 1. every kernel (decoder and memory policies), the CUDA backend's parity tests and every memory
#    policy through the CUDA backend (dms also with decoded tokens), the CUDA vision tower and M-RoPE
#    decoder of Qwen2-VL / Qwen2.5-VL (test_cuda_vl.py, with the 2B-width slice), on the real GPU (CI runs
#    them on the simulator)
# 2. vla-edge parity --backend cuda against transformers (bar: cosine >= 0.999) on the tiny default
#    and on a 2-layer slice of the Qwen2.5-1.5B shape, bf16 weights
# 3. bench/bench_gpu.py: the full 1.5B shape, prefill 64 + decode 8, against torch eager and the HBM floor
# 4. bench/bench_gpu_vision.py: the Qwen2-VL / Qwen2.5-VL vision towers on one 224x224 frame against
#    transformers on the same GPU (fp32 and bf16)
# 5. bench/bench_gpu_linear.py: the decode GEMV over 1.5B-shape layers with fp32, bf16, int8 and int4 weights,
#    GB/s against the card's peak bandwidth (each product first checked against the NumPy twin)
# 6. bench/bench_kv_store.py --backend cuda: a stored instruction's KV loaded against its prefill (16-64
#    tokens, the re-tasking case) and a 1,024-token prompt, on the 1.5B-shape slice
# Needs python3 with numba-cuda, torch (CUDA), transformers, numpy, pyyaml, opencv; installs nothing online.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export NUMBA_ENABLE_CUDASIM=0 NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1
work=$(mktemp -d)
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$work/site" "$repo" || exit 1
export PYTHONPATH="$work/site"
cd "$work"  # so that the checkout itself never shadows the installed package
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
status=0
step() { echo; echo "== $*"; "$@" || { echo "FAILED: $*"; status=1; }; }

# -m "not soak": the slow tier too (sweeps the simulator makes slow take seconds on the GPU)
step python3 -m pytest -q -p no:cacheprovider -c "$repo/pytest.ini" -m "not soak" "$repo/test/test_kernels.py" \
  "$repo/test/test_kernels_memory.py" "$repo/test/test_parity.py" "$repo/test/test_memory_policies.py" \
  "$repo/test/test_cuda_weights.py" -k "kernels or cuda"
# Qwen2-VL / Qwen2.5-VL: the CUDA vision tower and M-RoPE decoder against numpy and transformers, every tier,
# with the 2B-width slice (ViT head_dim 80) that only a real GPU runs
step python3 -m pytest -q -p no:cacheprovider -c "$repo/pytest.ini" -m "not soak" "$repo/test/test_cuda_vl.py"
# dms with decoded action tokens on the CUDA backend: marked slow for the simulator, seconds on a GPU
step python3 -m pytest -q -p no:cacheprovider -c "$repo/pytest.ini" -m slow "$repo/test/test_dms.py" -k cuda
ids=$(python3 -c 'print(",".join(str(7 * i % 1500 + 3) for i in range(48)))')
step python3 -m vla_edge_ros init-model --out "$work/tiny" --preset tiny
step python3 -m vla_edge_ros parity --model "$work/tiny" --backend cuda --token-ids "$ids"
step python3 -m vla_edge_ros init-model --out "$work/q2" --preset qwen2.5-1.5b-shape --layers 2
step python3 -m vla_edge_ros parity --model "$work/q2" --backend cuda --token-ids "$ids"
step python3 "$repo/bench/bench_gpu.py"
# the vision tower on one 224x224 frame, 8 of the real 32 blocks (time per block scales linearly)
step python3 "$repo/bench/bench_gpu_vision.py" --depth 8
step python3 "$repo/bench/bench_gpu_linear.py"
step python3 "$repo/bench/bench_kv_store.py" --backend cuda --tokens 16,64,1024
exit $status
