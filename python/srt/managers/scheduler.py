"""The scheduler (docs/design.md §3-4): continuous batching over one model runner.

`Scheduler` is the synchronous core: requests come in through `add_request`/`abort`, each `step`
runs one forward pass (an extend batch if any waiting request or prompt chunk can be admitted,
else a decode batch of every running request) and returns what the detokenizer should hear.
`scheduler_stage.SchedulerStage` runs it in the scheduler process. See `schedule_batch` for the
data flow and `schedule_policy` for admission.

Memory: every KV slot is free (allocator), in the radix cache (evictable or locked), or held by a
request that runs; `cache_manager.CacheManager` moves slots between them. `check_invariants`
verifies free + evictable + locked + held = total (and, when idle, that no request row or lock is
left); it runs whenever the loop goes idle, and after every step when `SRT_CHECK_INVARIANTS=1`
(tests).

A request constrained by a grammar waits in `grammar_queue` until the runner has compiled its
grammar (off this thread: `GenerationRunner.grammar_status`, polled once per step), then joins
the waiting queue like any other; one whose grammar cannot compile is refused with a 400. While
only grammars compile, the loop polls every `GRAMMAR_POLL_S`.
"""

from __future__ import annotations

import logging
import random
import time
from array import array

import numpy as np

from srt import envs
from srt.forward_mode import ForwardMode
from srt.io_struct import BatchTokenIDOut, FinishReason, GetLoadOut, TokenizedGenerateReq
from srt.managers.batch_log import BatchLogger
from srt.managers.cache_manager import CacheManager, req_row
from srt.managers.jump_forward import JumpForwarder
from srt.managers.req_queue import ReqQueue
from srt.managers.schedule_batch import Req, ScheduleBatch, make_output, stamp_first_tokens
from srt.managers.schedule_policy import (
    CLIP_MAX_NEW_TOKENS,
    AddResult,
    PrefillAdder,
    fill_array,
    order_waiting,
    shared_prefix_len,
)
from srt.managers.stop_strings import StopStringChecker
from srt.mem_cache import RadixCache, TokenToKVPoolAllocator
from srt.mem_cache.req_rows import ReqRowAllocator
from srt.model_executor.worker_batch import (
    GenerationBatchResult,
    GenerationRunner,
    ModelWorkerBatch,
)
from srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# Admission expects running requests to produce `new_token_ratio` of their remaining tokens:
# it starts at INIT, decays by DECAY per decode step down to MIN, and is re-estimated after a
# retraction (SGLang's schedule conservativeness).
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20
# A waiting request sharing this many uncached prompt tokens with one admitted in the same step
# waits one step to take them from the cache instead of computing them twice.
IN_BATCH_PREFIX_TOKENS = 32
# How often the scheduler process looks at compiling grammars while nothing else runs.
GRAMMAR_POLL_S = 0.002


class Scheduler:
    def __init__(
        self, server_args: ServerArgs, model_runner: GenerationRunner, tokenizer_path: str | None
    ) -> None:
        """`server_args` as the runner resolved them (`model_executor.resolve`)."""
        if server_args.page_size != 1:
            raise ValueError("the scheduler supports --page-size 1 only")
        if server_args.chunked_prefill_size is None:
            raise ValueError("the scheduler needs server arguments with device defaults resolved")
        self.server_args = server_args
        self.runner = model_runner
        limits = model_runner.limits
        self.context_length = limits.context_length
        self.vocab_size = limits.vocab_size
        self.eos_token_ids = limits.eos_token_ids
        self.rows = ReqRowAllocator(limits.max_running_requests)
        self.max_running_requests = limits.max_running_requests
        self.chunked_prefill_size: int = server_args.chunked_prefill_size
        self.allocator = TokenToKVPoolAllocator(limits.max_total_tokens)
        self.tree_cache = None if server_args.disable_radix_cache else RadixCache(1, self.allocator)
        self.cache = CacheManager(self.allocator, self.tree_cache, self.rows)
        self.stop_strings = StopStringChecker(tokenizer_path)
        self.rng = random.Random(server_args.random_seed)
        self.check_every_step = envs.check_invariants()

        self.waiting = ReqQueue()
        self.grammar_queue = ReqQueue()  # waiting for their grammar to compile
        self.running = ReqQueue()
        self.chunked_req: Req | None = None
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.outbox: list[Req] = []
        self.invariant_violations = 0
        self.num_retracted = 0
        self.batch_log = BatchLogger()
        self.jump_forward = JumpForwarder(self, server_args.enable_jump_forward)

    # ---- requests in ---------------------------------------------------------------------------

    def add_request(self, recv: TokenizedGenerateReq) -> None:
        """Queues a request, or refuses it at once: 400 if it can never be served, 429 if
        `--max-queued-requests` are already waiting."""
        req = Req(recv, self.eos_token_ids)
        problem = self._admission_problem(req)
        if problem is None and req.sampling_params.stop:
            problem = self.stop_strings.add(req)
        if problem is not None:
            self._refuse(req, problem, status_code=400)
            return
        if req.sampling_params.max_new_tokens == 0:  # nothing to generate: done at once
            req.finished_reason = FinishReason("length", length=0)
            self.stop_strings.forget(req)
            self.outbox.append(req)
            return
        limit = self.server_args.max_queued_requests
        if limit is not None and len(self.waiting) + len(self.grammar_queue) >= limit:
            self.stop_strings.forget(req)
            message = (
                f"too many requests: the waiting queue is full (--max-queued-requests {limit})"
            )
            self._refuse(req, message, status_code=429)
            return
        if req.sampling_params.grammar is not None:
            self.grammar_queue.append(req)
            self._poll_grammars()  # a cached grammar is ready at once
            return
        self.waiting.append(req)

    def _poll_grammars(self) -> None:
        """Moves requests whose grammar compiled to the waiting queue, in arrival order, and
        refuses those whose grammar cannot compile."""
        for req in list(self.grammar_queue):
            grammar = req.sampling_params.grammar
            assert grammar is not None, "only constrained requests wait for a grammar"
            status = self.runner.grammar_status(*grammar)
            if status.ready or status.error is not None:
                self.grammar_queue.remove(req)
            if status.ready:
                self.waiting.append(req)
            elif status.error is not None:
                self.stop_strings.forget(req)
                param = f"sampling_params.{grammar[0]}"
                self._refuse(req, status.error, status_code=400, param=param)

    def _refuse(self, req: Req, message: str, status_code: int, param: str = "") -> None:
        req.finished_reason = FinishReason(
            "abort", message=message, status_code=status_code, param=param
        )
        self.outbox.append(req)

    def _admission_problem(self, req: Req) -> str | None:
        prompt = len(req.origin_input_ids)
        if prompt == 0:
            return "the prompt is empty"
        if self._find(req.rid) is not None:
            return f"request id {req.rid!r} is already in flight"
        if min(req.origin_input_ids) < 0 or max(req.origin_input_ids) >= self.vocab_size:
            return f"token ids must be in [0, {self.vocab_size})"
        if req.logprob_start_len >= prompt:
            return (
                f"logprob_start_len ({req.logprob_start_len}) must be below the prompt length "
                f"({prompt} tokens)"
            )
        total = prompt + req.sampling_params.max_new_tokens
        if total > self.context_length:
            return (
                f"the prompt ({prompt} tokens) plus max_new_tokens "
                f"({req.sampling_params.max_new_tokens}) exceeds the context length "
                f"({self.context_length} tokens)"
            )
        if total > self.allocator.size:
            return (
                f"the prompt ({prompt} tokens) plus max_new_tokens "
                f"({req.sampling_params.max_new_tokens}) exceeds the KV cache "
                f"({self.allocator.size} tokens)"
            )
        return None

    def _find(self, rid: str) -> Req | None:
        """The live request with id `rid` (waiting, running or mid-chunk), in O(1)."""
        chunked = self.chunked_req
        if chunked is not None and chunked.rid == rid:
            return chunked
        for queue in (self.waiting, self.running, self.grammar_queue):
            req = queue.get(rid)
            if req is not None:
                return req
        return None

    def abort(self, rid: str) -> None:
        """Aborts request `rid` wherever it is ("" aborts all); unknown ids are ignored (the
        request may have finished meanwhile)."""
        if rid:
            req = self._find(rid)
            victims = [] if req is None else [req]
        else:
            victims = [*self.grammar_queue, *self.waiting, *self.running]
            if self.chunked_req is not None:
                victims.append(self.chunked_req)
        for req in victims:
            req.finished_reason = FinishReason("abort", message="aborted by request")
            queues = (self.waiting, self.running, self.grammar_queue)
            if not any(queue.remove(req) for queue in queues):
                self.chunked_req = None
            self._release(req)
            self.outbox.append(req)

    # ---- one step --------------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(
            self.waiting or self.running or self.chunked_req or self.outbox or self.grammar_queue
        )

    def is_idle(self) -> bool:
        return not (self.waiting or self.running or self.chunked_req or self.grammar_queue)

    def only_compiling(self) -> bool:
        """Whether the only work left is waiting for grammars to compile."""
        busy = self.waiting or self.running or self.chunked_req or self.outbox
        return bool(self.grammar_queue) and not busy

    def step(self) -> BatchTokenIDOut | None:
        """Runs one forward pass, if there is anything to run; returns the output to send."""
        if self.grammar_queue:
            self._poll_grammars()
        batch = self.get_new_batch_prefill() or self.get_decode_batch()
        if batch is not None:
            self.batch_log.log(batch, self.get_load)
            self.run_batch(batch)
            self.jump_forward.after_step(batch.reqs)
        if self.check_every_step:
            self.check_and_count()
        return self.take_output()

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        if not self.waiting and self.chunked_req is None:
            return None
        running = len(self.running) + (self.chunked_req is not None)
        reserved = (
            sum(min(r.remaining_new_tokens, CLIP_MAX_NEW_TOKENS) for r in self.running)
            * self.new_token_ratio
        )
        chunk = self.chunked_prefill_size
        adder = PrefillAdder(
            rem_total_tokens=self.cache.available() - reserved,
            rem_input_tokens=self.server_args.max_prefill_tokens,
            rem_chunk_tokens=None if chunk == -1 else chunk,
            rem_requests=min(self.max_running_requests - running, self.rows.available()),
        )
        chunked = self.chunked_req
        if chunked is not None:
            # Bounded by the memory there is: running requests retract if they run short later.
            rest = list(chunked.fill_ids()[chunked.kv_len :])
            adder.add_chunked_req(chunked, rest[: self.cache.available()], len(rest))
        ordered = order_waiting(
            self.waiting, self.server_args.schedule_policy, self._cached_prefix, self.rng
        )
        in_batch = [fill_array(chunked)] if chunked is not None else []
        for req in ordered:
            result = self._try_admit(req, adder, in_batch)
            if result is not AddResult.CONTINUE:
                break
        self.chunked_req = adder.new_chunked_req
        admitted = adder.can_run
        if adder.new_chunked_req is not None and adder.new_chunked_req.extend_ids:
            admitted = [*admitted, adder.new_chunked_req]
        for req in admitted:
            self.waiting.remove(req)
        if self.chunked_req is not None:
            self.waiting.remove(self.chunked_req)
        return ScheduleBatch(ForwardMode.EXTEND, admitted) if admitted else None

    def _cached_prefix(self, req: Req) -> list[int]:
        """The ids of the longest cached prefix of `req` it may use (`Req.prefix_limit`)."""
        if self.tree_cache is None:
            return []
        fill = req.fill_ids()
        slots, _ = self.tree_cache.match_prefix(fill[: req.prefix_limit()])
        return list(fill[: len(slots)])

    def _try_admit(self, req: Req, adder: PrefillAdder, in_batch: list[np.ndarray]) -> AddResult:
        """Admits `req` into the step if the budgets allow. A request sharing at least
        `IN_BATCH_PREFIX_TOKENS` uncached tokens with one admitted in this step waits a step
        instead, to find them in the cache (SGLang's in-batch prefix caching)."""
        fill = req.fill_ids()
        slots, node = array("i"), None
        if self.tree_cache is not None:
            limit = req.prefix_limit()
            slots, node = self.tree_cache.match_prefix(fill[:limit])
            ids = fill_array(req)
            shared = max((shared_prefix_len(ids, other) for other in in_batch), default=0)
            shared = min(shared, limit)
            if shared - len(slots) >= IN_BATCH_PREFIX_TOKENS:
                return AddResult.CONTINUE
            adder.rem_total_tokens += self.tree_cache.inc_lock_ref(node)
        result = adder.add_one_req(req, list(fill[len(slots) :]))
        admitted = req in adder.can_run or adder.new_chunked_req is req
        if not admitted:
            if self.tree_cache is not None and node is not None:
                adder.rem_total_tokens += self.tree_cache.dec_lock_ref(node)
            return result
        if self.tree_cache is not None:
            in_batch.append(ids)
        row = self.rows.alloc(1)
        assert row is not None, "the adder counted free rows"
        req.row = row[0]
        req.kv_slots, req.prefix_len, req.last_node = slots, len(slots), node
        req.row_synced = 0
        if not req.admitted:
            req.cached_tokens = len(slots)
            req.admitted = True
            req.scheduled_at = time.time()
            self.runner.add_request(req.rid, req.sampling_spec())
        return result

    def get_decode_batch(self) -> ScheduleBatch | None:
        if not self.running:
            return None
        if self.cache.available() < len(self.running):
            self._retract_until_decodable()
            if not self.running:
                return None
        self.new_token_ratio = max(
            self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO
        )
        return ScheduleBatch(ForwardMode.DECODE, list(self.running))

    def _retract_until_decodable(self) -> None:
        """Retracts running requests (fewest outputs first, then longest prompt) until every
        remaining one can get a slot for its next token."""
        victims = sorted(self.running, key=lambda r: (len(r.output_ids), -len(r.origin_input_ids)))
        retracted: list[Req] = []
        while self.running and self.cache.available() < len(self.running):
            victim = victims.pop(0)
            self.running.remove(victim)
            self._release(victim, keep_stop_state=True)
            retracted.append(victim)
        self.waiting.prepend(retracted)
        self.num_retracted += len(retracted)
        total_max_new = sum(r.sampling_params.max_new_tokens for r in self.running)
        decoded = sum(len(r.output_ids) for r in self.running)
        if total_max_new:
            self.new_token_ratio = min(
                1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / total_max_new
            )
        logger.warning(
            "KV cache full: retracted %d request(s); new_token_ratio %.3f",
            len(retracted),
            self.new_token_ratio,
        )

    def run_batch(self, batch: ScheduleBatch) -> None:
        self.process_batch_result(
            batch, self.runner.forward_batch_generation(self.worker_batch(batch))
        )

    def worker_batch(self, batch: ScheduleBatch) -> ModelWorkerBatch:
        """Gives `batch`'s new tokens their KV slots and says what the runner must run."""
        reqs = batch.reqs
        slots = self.cache.alloc(batch.num_new_tokens)
        extend = batch.forward_mode is ForwardMode.EXTEND
        if extend:
            new_ids = [req.extend_ids for req in reqs]
            positions = [req.logit_positions() for req in reqs]
        else:
            new_ids = [[req.output_ids[-1]] for req in reqs]
        row_writes, extend_lens, start = [], [], 0
        for req, ids in zip(reqs, new_ids, strict=True):
            if req.row_synced < req.kv_len:  # the runner's row lacks slots it already has
                row_writes.append((req_row(req), req.row_synced, req.kv_slots[req.row_synced :]))
            req.kv_slots.extend(slots[start : start + len(ids)])
            req.row_synced = req.kv_len
            extend_lens.append(len(ids))
            start += len(ids)
        return ModelWorkerBatch(
            forward_mode=batch.forward_mode,
            rids=[req.rid for req in reqs],
            rows=[req_row(req) for req in reqs],
            seq_lens=[req.kv_len for req in reqs],
            extend_lens=extend_lens,
            input_ids=[token for ids in new_ids for token in ids],
            out_cache_loc=slots,
            row_writes=row_writes,
            logit_lens=[len(where) for where in positions] if extend else None,
            # A chunk of a longer prompt gets no token.
            sample=[req.kv_len == req.fill_len for req in reqs] if extend else None,
            prompt_logprobs=(
                [req.prompt_logprobs(where) for req, where in zip(reqs, positions, strict=True)]
                if extend
                else None
            ),
        )

    def process_batch_result(self, batch: ScheduleBatch, result: GenerationBatchResult) -> None:
        for req, logprobs, tops in zip(
            batch.reqs, result.input_token_logprobs, result.input_top_logprobs, strict=True
        ):
            if logprobs:
                req.input_token_logprobs.extend(logprobs)
                req.input_top_logprobs.extend(tops)
        for req in batch.reqs:
            if req.kv_len < req.fill_len:  # a chunk of a longer prompt: cache it, no token
                self.cache.cache_unfinished(req)
        reqs = [req for req in batch.reqs if req.kv_len == req.fill_len]
        if batch.forward_mode is ForwardMode.EXTEND:
            stamp_first_tokens(reqs)
        for j, req in enumerate(reqs):
            req.output_ids.append(result.next_ids[j])
            if req.return_logprob:
                req.output_logprobs.append(result.logprobs[j])
                req.output_top_logprobs.append(tuple(result.top_logprobs[j]))
            req.check_finished(self.context_length, grammar_ended=j in result.grammar_ended)
            # A stop string the last allowed token completes still ends the text there.
            reason = req.finished_reason
            if req.sampling_params.stop and (reason is None or reason.type == "length"):
                self.stop_strings.check(req)
            if batch.forward_mode is ForwardMode.EXTEND and not req.finished():
                self.cache.cache_unfinished(req)  # later requests can share the prompt at once
                self.running.append(req)
            if req.finished():
                self.running.remove(req)
                self._release(req)
                self.outbox.append(req)
            elif req.stream and self._stream_due(req):
                self.outbox.append(req)

    def _stream_due(self, req: Req) -> bool:
        new = len(req.output_ids) - req.sent_len
        return req.sent_len == 0 or new >= self.server_args.stream_interval

    # ---- KV memory -------------------------------------------------------------------------

    def _release(self, req: Req, keep_stop_state: bool = False) -> None:
        """Gives back everything `req` holds (`CacheManager.release`) and, unless it is only
        retracted, its stop-string and sampling state."""
        self.cache.release(req)
        if not keep_stop_state:
            self.stop_strings.forget(req)
            self.runner.remove_request(req.rid)

    def flush_cache(self) -> str | None:
        """Empties the radix cache; refused (returns why) while any request is in flight."""
        if not self.is_idle():
            return "requests are in flight"
        self.cache.flush()
        return None

    # ---- output ------------------------------------------------------------------------------

    def take_output(self) -> BatchTokenIDOut | None:
        if not self.outbox:
            return None
        reqs, self.outbox = self.outbox, []
        out = make_output(reqs)
        for req in reqs:
            req.sent_len = len(req.output_ids)
            req.settings_sent = True
            req.input_logprobs_sent |= not req.input_logprobs_pending
        return out

    # ---- integrity ---------------------------------------------------------------------------

    def check_invariants(self) -> list[str]:
        """What is wrong with the KV bookkeeping (empty when all is well)."""
        holders = [*self.running, *([self.chunked_req] if self.chunked_req else [])]
        return self.cache.check_invariants(holders, self.is_idle())

    def check_and_count(self) -> None:
        problems = self.check_invariants()
        if problems:
            self.invariant_violations += 1
            logger.error("KV integrity violated: %s", "; ".join(problems))

    def get_load(self, rid: str = "") -> GetLoadOut:
        """How busy the scheduler is (the reply to `GetLoadReq` `rid`). Used tokens are the slots
        held by requests or locked in the cache (free and evictable ones excluded)."""
        total = self.allocator.size
        waiting = [*self.waiting, *self.grammar_queue]
        return GetLoadOut(
            rid=rid,
            num_running_reqs=len(self.running) + (self.chunked_req is not None),
            num_waiting_reqs=len(waiting),
            num_used_tokens=total - self.cache.available(),
            max_total_tokens=total,
            invariant_violations=self.invariant_violations,
            num_retracted_reqs=self.num_retracted,
            num_waiting_tokens=sum(req.fill_len for req in waiting),
        )
