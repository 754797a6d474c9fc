"""Constrained decoding: grammars (JSON Schema, regex, EBNF) compiled by xgrammar, and the masks
they put on a batch's logits (`xgrammar_backend`, `grammar_mask`). A JSON Schema is checked
keyword by keyword first, and the strings it bounds get grammar srt writes (`schema_grammar`)."""
