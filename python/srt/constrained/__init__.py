"""Constrained decoding: grammars (JSON Schema, regex, EBNF) compiled by xgrammar, and the masks
they put on a batch's logits (`xgrammar_backend`, `grammar_mask`)."""
