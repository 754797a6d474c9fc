"""Our own PyTorch implementations of Hugging Face architectures, chosen by `registry`."""
