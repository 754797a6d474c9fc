"""Inter-process communication: the message codec and channels over shared-memory rings."""
