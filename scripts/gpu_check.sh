#!/usr/bin/env bash
# The GPU checks of issue 5, as one prepared run on a machine lent through the device tool
# (CUDA, torch and triton there; no network and no Rust toolchain).
#
# Prepare here, once:  echo /.whl/ >> .git/info/exclude && maturin build --release -o .whl
#   (and, with --no-deps, `pip download` wheels of any runtime package missing there, e.g. gguf;
#   flashinfer-python with its matching flashinfer-cubin/flashinfer-jit-cache for the flashinfer
#   checks, which are skipped without it)
# Run there, carrying .whl:  bash scripts/gpu_check.sh   (results land in $OUT)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/srt-gpu-check}
mkdir -p "$out"

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out/gpu.txt"

# Kernels and attention backends on CUDA, against their torch references; decode CUDA graphs
# (capture + replay) against eager decoding.
python3 -m pytest -q -rs tests/test_store_kv_cache.py tests/test_attention_kernels.py \
    tests/test_attention_backends.py tests/test_kv_indices.py tests/test_cuda_graph_runner.py \
    2>&1 | tee "$out/pytest.log"

# Decode step time of a Llama-3-8B-shaped bf16 model with random weights, beside its
# memory-bandwidth floor: with CUDA graphs (the default), then eagerly for comparison.
python3 -m srt.testing.make_tiny_model --arch llama --preset llama3-8b --no-weights \
    --context-length 8192 --out /tmp/llama3-8b
python3 benches/bench_one_batch.py --model /tmp/llama3-8b --load-format dummy \
    --batch-sizes 1 8 32 64 --input-len 512 --output-len 16 --json "$out/one_batch.json"
python3 benches/bench_one_batch.py --model /tmp/llama3-8b --load-format dummy \
    --batch-sizes 1 8 --input-len 512 --output-len 16 --disable-cuda-graph \
    --json "$out/one_batch_eager.json"

# Tensor parallelism over NCCL (machines with at least 2 GPUs): TP=2's logits against TP=1's
# (the bench exits non-zero past its tolerance), with each degree's step times.
if [ "$(python3 -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    python3 benches/scale_tp.py --device cuda --tp 2 --batch-size 32 --input-len 256 \
        --json "$out/scale_tp.json" 2>&1 | tee "$out/scale_tp.log"
fi
