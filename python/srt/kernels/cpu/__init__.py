"""The facades over srt's Rust CPU kernels: tensors in, the kernels' buffers checked and passed
as numpy views of their memory (see `cpu_kernels`)."""
