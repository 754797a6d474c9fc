"""The model runner: loads a model and its KV memory, and runs forward passes."""
