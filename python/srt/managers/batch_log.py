"""The scheduler's log lines about batches (not single requests), in SGLang's words:

    Prefill batch. #new-seq: 2, #new-token: 40, #cached-token: 12, token usage: 0.01, ...
    Decode batch. #running-req: 3, #token: 96, token usage: 0.02, gen throughput (token/s): ...

Every extend batch gets a prefill line; decode batches get one line every `decode_interval`
steps, with the generation throughput over those steps. Counts of running and queued requests
and KV usage are taken before the batch runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from srt.io_struct import GetLoadOut
from srt.managers.schedule_batch import ForwardMode, Req, ScheduleBatch

logger = logging.getLogger(__name__)

DECODE_LOG_INTERVAL = 40


class BatchLogger:
    """Logs the scheduler's batches; `log` is called once per step, before the batch runs."""

    def __init__(self, decode_interval: int = DECODE_LOG_INTERVAL) -> None:
        if decode_interval < 1:
            raise ValueError(f"decode_interval must be >= 1, got {decode_interval}")
        self.decode_interval = decode_interval
        # The request whose prompt the previous extend left unfinished: its next chunk starts
        # after its own earlier chunks, which are no cache hit.
        self.chunked: Req | None = None
        self.decode_steps = 0
        self.decode_tokens = 0
        self.decode_since = 0.0
        self.num_batches = 0  # forward passes, extend and decode

    def log(self, batch: ScheduleBatch, load: Callable[[], GetLoadOut]) -> None:
        """Logs `batch` if its line is due; `load` gives the scheduler's load (called only then)."""
        self.num_batches += 1
        if batch.forward_mode is ForwardMode.EXTEND:
            self.log_prefill(batch, load())
        else:
            self.count_decode(batch, load)

    def log_prefill(self, batch: ScheduleBatch, load: GetLoadOut) -> None:
        new_tokens = sum(len(req.extend_ids) for req in batch.reqs)
        cached = sum(req.kv_len for req in batch.reqs if req is not self.chunked)
        self.chunked = next(
            (r for r in batch.reqs if r.kv_len + len(r.extend_ids) < r.fill_len), None
        )
        logger.info(
            "Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, token usage: %.2f, "
            "#running-req: %d, #queue-req: %d",
            len(batch.reqs),
            new_tokens,
            cached,
            _usage(load),
            load.num_running_reqs,
            load.num_waiting_reqs,
        )

    def count_decode(self, batch: ScheduleBatch, load: Callable[[], GetLoadOut]) -> None:
        now = time.perf_counter()
        if self.decode_steps == self.decode_interval:
            current = load()
            logger.info(
                "Decode batch. #running-req: %d, #token: %d, token usage: %.2f, "
                "gen throughput (token/s): %.2f, #queue-req: %d",
                len(batch.reqs),
                current.num_used_tokens,
                _usage(current),
                self.decode_tokens / max(now - self.decode_since, 1e-9),
                current.num_waiting_reqs,
            )
            self.decode_steps = self.decode_tokens = 0
        if self.decode_steps == 0:
            self.decode_since = now
        self.decode_steps += 1
        self.decode_tokens += len(batch.reqs)


def _usage(load: GetLoadOut) -> float:
    return load.num_used_tokens / load.max_total_tokens if load.max_total_tokens else 0.0
