"""Attention backends behind one interface, chosen by `--attention-backend`."""
