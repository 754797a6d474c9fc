"""The stage managers of srt: tokenizer manager, scheduler, detokenizer manager and their parts."""
