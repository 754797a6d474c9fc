"""The per-step half of constrained decoding: before sampling, each constrained row's logits lose
every token its grammar does not allow next; after, each matcher takes the token sampled.

Only constrained rows are filled and masked (unconstrained rows of the same batch cost nothing);
the bitmask buffer (one bit per vocabulary id, per row) is kept and grown with the batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import xgrammar as xgr

logger = logging.getLogger(__name__)


class GrammarMasks:
    """Masks the logits of a batch's constrained rows; `vocab_size` is the logits' width."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def apply(self, logits: torch.Tensor, matchers: Sequence[xgr.GrammarMatcher | None]) -> None:
        """Sets to -inf, in place, each logit of row i that `matchers[i]` does not allow (rows
        whose matcher is None are left alone)."""
        rows = [i for i, matcher in enumerate(matchers) if matcher is not None]
        if not rows:
            return
        if logits.shape != (len(matchers), self.vocab_size):
            raise ValueError(
                f"logits of shape {tuple(logits.shape)} for {len(matchers)} rows of "
                f"{self.vocab_size} ids"
            )
        if self.bitmask.shape[0] < len(matchers):
            self.bitmask = xgr.allocate_token_bitmask(len(matchers), self.vocab_size)
        for i in rows:
            matcher = matchers[i]
            assert matcher is not None
            matcher.fill_next_token_bitmask(self.bitmask, i)
        bitmask = self.bitmask[: len(matchers)]
        if bitmask.device != logits.device:
            bitmask = bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, bitmask, indices=rows)


def accept_tokens(
    matchers: Sequence[xgr.GrammarMatcher | None], tokens: Sequence[int]
) -> frozenset[int]:
    """Advances each matcher by its row's sampled token; returns the rows whose grammar ended
    (it took a stop token after a complete match). A token the grammar refuses can only come
    from a row whose every logit was masked: the row ends too, and the error is logged."""
    ended = set()
    for i, (matcher, token) in enumerate(zip(matchers, tokens, strict=True)):
        if matcher is None:
            continue
        if not matcher.accept_token(token):
            logger.error("the grammar refused sampled token %d: its request ends", token)
            ended.add(i)
        elif matcher.is_terminated():
            ended.add(i)
    return frozenset(ended)
