"""Jump-forward decoding, the runner's half (SGLang's compressed FSM): where a request's grammar
admits exactly one continuation text (`GrammarMatcher.find_jump_forward_string`), that text is
tokenized here and the matcher advanced over its tokens, which the scheduler appends to the
request without a forward pass each (`managers.jump_forward`).

Token boundaries. The tokens must be ones the model's tokenizer would have produced, or the
model continues from a tokenization it never saw in training:

- at the start, the forced text may merge with the request's last output tokens (`{` then
  `"name"` is `{"`, `name`, `"` for most BPE vocabularies): the last output ids are decoded,
  the forced text appended and the whole re-tokenized, as SGLang does; the output ids that
  change are rolled back (matcher included), as many as the scheduler allows (it allows only
  the token just sampled). When the merge reaches further back, the forced text is tokenized on
  its own (still exactly its bytes, so still valid);
- at the end, a last token that is a strict prefix of a longer vocabulary token (` "` of
  ` "John`) is left for the model to sample, which may then extend it.

Every tokenization is checked to decode to exactly the text it stands for; a jump that fails a
check, or gains fewer than `MIN_GAIN` tokens, is not made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import xgrammar as xgr
from tokenizers import Tokenizer

from srt.model_executor.worker_batch import JumpForward

# The fewest tokens (appended minus rolled back) worth a jump: the scheduler re-admits a jumped
# request with an extend pass, in which the other running requests do not decode.
MIN_GAIN = 2
# How many of a request's last output ids give the forced text its left context.
CONTEXT_IDS = 8


@dataclass(eq=False)
class ForcedTokenizer:
    """Tokenizes forced text with the model's tokenizer; `decoded_vocab[i]` is token i's bytes
    (xgrammar's view of the vocabulary)."""

    tokenizer: Tokenizer
    decoded_vocab: Sequence[bytes]
    # Every strict prefix of a token's bytes: built at the first jump (~0.1 s for 49k tokens).
    _extensible: frozenset[bytes] | None = field(default=None, init=False, repr=False)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def extensible(self, token: int) -> bool:
        """Whether some longer vocabulary token starts with `token`'s bytes."""
        if self._extensible is None:
            self._extensible = frozenset(
                piece[:n] for piece in self.decoded_vocab for n in range(1, len(piece))
            )
        return 0 <= token < len(self.decoded_vocab) and (
            self.decoded_vocab[token] in self._extensible
        )

    def tokenize(
        self, recent: Sequence[int], forced: str, max_rollback: int
    ) -> tuple[int, list[int]] | None:
        """(how many of `recent`'s last ids to replace, the ids that follow) for `forced` after
        the output ids `recent`, replacing at most `max_rollback` of them; None if no
        tokenization decodes exactly."""
        if recent:
            context = self.decode(recent)
            if "\ufffd" not in context:  # `recent` does not end inside a character
                ids = self.encode(context + forced)
                keep = _common_prefix(ids, recent)
                rollback = len(recent) - keep
                if rollback <= max_rollback and self.decode(ids) == context + forced:
                    return rollback, ids[keep:]
        ids = self.encode(forced)
        return (0, ids) if self.decode(ids) == forced else None


def jump(
    matcher: xgr.GrammarMatcher,
    tokens: ForcedTokenizer,
    output_ids: Sequence[int],
    max_rollback: int,
    budget: int,
) -> JumpForward | None:
    """Plans and makes the jump of a request whose output so far is `output_ids` (the matcher
    has taken every one): the matcher rolls back and takes the forced ids. At most
    `max_rollback` output ids may change, and the output grows by at most `budget` ids."""
    if budget <= 0 or matcher.is_terminated():  # a terminated matcher has nothing to force
        return None
    forced = matcher.find_jump_forward_string()
    if not forced:
        return None
    recent = output_ids[-CONTEXT_IDS:]
    planned = tokens.tokenize(recent, forced, min(max_rollback, len(recent)))
    if planned is None:
        return None
    rollback, ids = planned
    if ids and tokens.extensible(ids[-1]):
        ids = ids[:-1]
    ids = ids[: budget + rollback]
    if len(ids) - rollback < min(MIN_GAIN, budget):
        return None
    replaced = recent[len(recent) - rollback :]
    if rollback:
        matcher.rollback(rollback)
    for n, token in enumerate(ids):
        if not matcher.accept_token(token):  # not expected: the ids spell forced bytes
            if n:
                matcher.rollback(n)
            for old in replaced:
                matcher.accept_token(old)
            return None
    return JumpForward(rollback=rollback, ids=ids)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
