"""Tool calls in model output: parsers that find them in the text (one file per format, chosen
by `--tool-call-parser` through `registry`), whole or chunk by chunk, and the grammars that
force a call when the request requires one (`constraint`)."""
