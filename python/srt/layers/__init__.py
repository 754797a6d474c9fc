"""Building blocks of the models: norms, rotary embeddings, attention, logits, sampling."""
