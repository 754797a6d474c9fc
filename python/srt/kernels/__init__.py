"""srt's kernels, installed as `srt.kernels` (never as a top-level `kernels` package).

- `cpu/`: the facades over the Rust CPU kernels (`srt._rust`, from the `srt-kernels` crate):
  `cpu_kernels` (float32 and bf16 linear layers, attention, row-wise operators, the router of a
  mixture of experts), `quant_kernels` (products on GGUF blocks) and `plan_cache` (which path a
  quantized product takes, measured once per machine and shape).
- `triton/`: Triton kernels (attention, the KV store), run on CUDA and, under
  `TRITON_INTERPRET=1`, tested on the CPU.

They sit under the layers (docs/design.md §7): they know tensors and instructions, never models.
"""
