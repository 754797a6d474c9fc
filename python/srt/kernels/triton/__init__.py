"""srt's Triton kernels (`srt.kernels.triton`).

Each kernel file opens with its scope and has one typed Python launcher that checks shapes and
strides before launch. On CPU they run under `TRITON_INTERPRET=1`.
"""
