"""Jump-forward decoding, the scheduler's half (`--enable-jump-forward`; SGLang's compressed
FSM): after a forward pass, each constrained request that runs on asks the runner for the tokens
its grammar forces next (`GenerationRunner.jump_forward`, which tokenizes them and advances the
matcher: `srt.constrained.jump_forward`), takes them as output ids, and goes back to the front
of the waiting queue; its next pass is an extend over them, after the prefix the radix cache
holds, and samples the token after them. A forward pass then yields many tokens.

    running ─▶ runner.jump_forward ─▶ KV into the radix cache (cache.release) ─▶ output ids
        changed ─▶ waiting (front) ─▶ extend over the new ids, prefix from the cache ─▶ running

It is off by default although asking costs next to nothing (about a microsecond per
constrained request and step: `benches/bench_structured.py`): each jump adds an extend pass in
which the other running requests do not decode, and a jumped output is tokenized as the
tokenizer would encode it, not as the model would have sampled it, so it may differ from the
output without jumps.

What stays true:

- KV: the request gives back its KV keyed by its ids before they change (the cache keeps them,
  evictable), exactly as a retraction does, so no slot leaks or is freed twice; re-admitted, it
  matches the longest prefix still valid for its new ids.
- Only the token the pass just sampled may be rolled back (replaced by a re-tokenization that
  starts with its text): nothing has been sent of it yet, so streamed and non-streamed
  requests get the same tokens whatever their stream interval. With stop strings, none is:
  the stop-string checker has decoded it.
- Stop conditions: the forced ids are appended one at a time, each checked as a sampled one is
  (`max_new_tokens`, the context length, stop tokens, stop strings); the ids after the one that
  finishes the request are dropped. The grammar's own end needs a stop token, which is never
  forced: it is sampled after the jump.
- Logprobs: a forced token is not drawn from the model; its logprob is reported as 0.0 (the
  grammar left no other text) and its top logprobs, when asked for, as itself alone. A rolled
  back token's logprob goes with it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from srt.managers.schedule_batch import Req

if TYPE_CHECKING:  # the scheduler builds this manager
    from srt.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)

FORCED_LOGPROB = 0.0


class JumpForwarder:
    """Jumps the scheduler's constrained requests forward after each pass; counts what it did."""

    def __init__(self, scheduler: Scheduler, enabled: bool) -> None:
        self.scheduler = scheduler
        if enabled and scheduler.tree_cache is None:
            # Re-admitted without the cache, a jumped request would compute its whole
            # sequence again.
            logger.warning("jump-forward decoding is off: it needs the radix cache")
            enabled = False
        self.enabled = enabled
        self.num_jumps = 0
        self.num_forced_tokens = 0  # output ids appended by jumps (rolled-back ones not counted)
        self.num_rolled_back = 0

    def after_step(self, reqs: list[Req]) -> None:
        """Jumps each request of the pass just run that still runs under a grammar."""
        if not self.enabled:
            return
        running = self.scheduler.running
        for req in reqs:
            if req.sampling_params.grammar is not None and req in running:
                self.jump(req)

    def jump(self, req: Req) -> None:
        s = self.scheduler
        unsent = len(req.output_ids) - req.sent_len  # 1: take_output comes after this
        max_rollback = 0 if req.sampling_params.stop else min(unsent, 1)
        budget = min(req.remaining_new_tokens, s.context_length - req.fill_len)
        made = s.runner.jump_forward(req.rid, max_rollback, budget)
        if made is None:
            return
        s.running.remove(req)
        s.cache.release(req)  # keyed by the ids the KV was computed for, before they change
        keep = len(req.output_ids) - made.rollback
        del req.output_ids[keep:], req.output_logprobs[keep:], req.output_top_logprobs[keep:]
        self.num_jumps += 1
        self.num_rolled_back += made.rollback
        for token in made.ids:
            self._append(req, token)
            if req.finished():
                break
        if req.finished():
            s._release(req)  # its KV went above; its stop-string and sampling state go now
        else:
            s.waiting.prepend([req])
        if (req.finished() or (req.stream and s._stream_due(req))) and req not in s.outbox:
            s.outbox.append(req)

    def _append(self, req: Req, token: int) -> None:
        """Appends forced `token` and checks the stop conditions, as a sampled token is."""
        s = self.scheduler
        req.output_ids.append(token)
        self.num_forced_tokens += 1
        if req.return_logprob:
            req.output_logprobs.append(FORCED_LOGPROB)
            req.output_top_logprobs.append(
                ((token, FORCED_LOGPROB),) if req.top_logprobs_num else ()
            )
        req.check_finished(s.context_length)
        reason = req.finished_reason
        if req.sampling_params.stop and (reason is None or reason.type == "length"):
            s.stop_strings.check(req)
