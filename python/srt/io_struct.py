"""Every message that crosses a process boundary (docs/design.md §1-2), one section per
receiving ring.

Each message is a frozen, slotted record of ints, floats, bools, strings and tuples of them (no
tensors, no Python objects), so `srt.ipc.codec` can encode it without pickle. Every message
carries the request id(s) it concerns; control messages carry an id of their own that the reply
repeats. Token ids are tuples of ints that fit in int32.

    MAIN ──"scheduler"──▶ SCHEDULER ──"detokenizer"──▶ DETOKENIZER ──"tokenizer"──▶ MAIN

Replies of the scheduler to the main process (flush-cache results, load, health) ride ring
"detokenizer"; the detokenizer forwards them to ring "tokenizer" unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from srt.sampling_params import SamplingParams

# ---- ring "scheduler": MAIN → SCHEDULER ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenizedGenerateReq:
    """A validated, tokenized generate request. With `return_logprob` and `logprob_start_len`
    >= 0 (below the prompt's length), the logprobs of the prompt tokens from that position on
    come back too (SGLang's meaning; -1: none)."""

    rid: str
    input_ids: tuple[int, ...]
    sampling_params: SamplingParams
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1


@dataclass(frozen=True, slots=True)
class AbortReq:
    """Stop a request (its client went away or asked to abort); `rid` "" aborts all."""

    rid: str


@dataclass(frozen=True, slots=True)
class FlushCacheReq:
    """Empty the radix cache (only succeeds while no request runs)."""

    rid: str


@dataclass(frozen=True, slots=True)
class GetLoadReq:
    """Ask the scheduler how busy it is."""

    rid: str


@dataclass(frozen=True, slots=True)
class HealthCheckReq:
    """Ask the scheduler whether its loop is alive."""

    rid: str


@dataclass(frozen=True, slots=True)
class ShutdownReq:
    """Stop the pipeline: the scheduler forwards it to the detokenizer, then both exit."""

    rid: str


# ---- ring "detokenizer": SCHEDULER → DETOKENIZER ---------------------------------------------


@dataclass(frozen=True, slots=True)
class FinishReason:
    """Why a request ended, in SGLang's terms (`to_json` gives SGLang's `finish_reason` dict).

    - "stop": an EOS or stop token id (`matched_token`) or a stop string (`matched_str`, which
      the scheduler found starting `matched_offset` characters into the output text: the
      detokenizer cuts the text there, or after it with `no_stop_trim`);
    - "length": `length` tokens were generated (max_new_tokens, or the context ran out);
    - "abort": the client or the server stopped it; `message` says why, and `status_code` is
      the HTTP status of a refusal (400 for a request the scheduler cannot serve, 429 for a
      full queue), 0 when a client or user aborted it; `param` names the request field a
      refusal is about (native names, e.g. `sampling_params.json_schema`), if any.
    """

    type: str
    matched_token: int | None = None
    matched_str: str | None = None
    matched_offset: int = -1
    length: int = 0
    message: str = ""
    status_code: int = 0
    param: str = ""

    def to_json(self) -> dict[str, object]:
        if self.type == "stop":
            matched = self.matched_str if self.matched_str is not None else self.matched_token
            return {"type": "stop", "matched": matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        out: dict[str, object] = {"type": self.type, "message": self.message}
        if self.status_code:
            out["status_code"] = self.status_code
        if self.param:
            out["param"] = self.param
        return out


@dataclass(frozen=True, slots=True)
class DetokenizeSettings:
    """What the detokenizer needs of a request besides its ids, sent once, with its first
    output: the last prompt ids (decoded ahead of the output by the incremental detokenizer),
    and its stop strings, only to hold back text that could still begin one (the scheduler
    decides the match)."""

    context_ids: tuple[int, ...]
    skip_special_tokens: bool
    no_stop_trim: bool
    stop: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReqTimeStats:
    """When the scheduler saw a request's stages, in wall-clock seconds (`time.time()`, the one
    clock all three processes share; 0.0: the request never got there): it arrived (`queued`),
    was first admitted to a batch (`scheduled`), got its first token (`first_token`) and
    finished (`finished`). Sent once, with the request's finished message; `index` is its
    position in that message's `rids`."""

    index: int
    queued: float
    scheduled: float
    first_token: float
    finished: float


@dataclass(frozen=True, slots=True)
class BatchTokenIDOut:
    """New token ids of the requests of one scheduler step; all tuples are indexed alike.

    `output_ids[i]` holds only the ids produced since the previous message for `rids[i]`;
    `finished_reasons[i]` is None while the request runs. `settings[i]` is set in a request's
    first message only (None in the others). With `return_logprob`,
    `output_logprobs[i]` has the logprob of each id of `output_ids[i]` and
    `output_top_logprobs[i]` its `top_logprobs_num` best (id, logprob) pairs; else both are ().

    Prompt logprobs come once, in a request's first message after its prompt is prefilled:
    `input_token_logprobs[i]` has the logprob of each prompt token from `logprob_start_len` on
    (None for position 0, which has none), `input_top_logprobs[i]` the best pairs of each
    position from there (none for position 0) when `top_logprobs_num` > 0; else both are ().

    `time_stats` is sparse, so that a decode step pays nothing for it: one entry per request
    this message finishes (see `ReqTimeStats`).
    """

    rids: tuple[str, ...]
    output_ids: tuple[tuple[int, ...], ...]
    finished_reasons: tuple[FinishReason | None, ...]
    prompt_tokens: tuple[int, ...]
    completion_tokens: tuple[int, ...]
    cached_tokens: tuple[int, ...]
    settings: tuple[DetokenizeSettings | None, ...]
    output_logprobs: tuple[tuple[float, ...], ...]
    output_top_logprobs: tuple[tuple[tuple[tuple[int, float], ...], ...], ...]
    input_token_logprobs: tuple[tuple[float | None, ...], ...]
    input_top_logprobs: tuple[tuple[tuple[tuple[int, float], ...], ...], ...]
    time_stats: tuple[ReqTimeStats, ...] = ()


# ---- ring "tokenizer": DETOKENIZER → MAIN ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchStrOut:
    """New text of the requests of one step; all tuples are indexed alike.

    `output_strs[i]` is the text added since the previous message for `rids[i]` (stop strings
    trimmed unless `no_stop_trim`), `output_ids[i]` the token ids behind it. Logprobs and
    `time_stats` are those of the `BatchTokenIDOut` it came from; `detokenized_at` is when the
    detokenizer sent it on (wall clock; set only when `time_stats` is not empty).
    """

    rids: tuple[str, ...]
    output_strs: tuple[str, ...]
    output_ids: tuple[tuple[int, ...], ...]
    finished_reasons: tuple[FinishReason | None, ...]
    prompt_tokens: tuple[int, ...]
    completion_tokens: tuple[int, ...]
    cached_tokens: tuple[int, ...]
    output_logprobs: tuple[tuple[float, ...], ...]
    output_top_logprobs: tuple[tuple[tuple[tuple[int, float], ...], ...], ...]
    input_token_logprobs: tuple[tuple[float | None, ...], ...]
    input_top_logprobs: tuple[tuple[tuple[tuple[int, float], ...], ...], ...]
    time_stats: tuple[ReqTimeStats, ...] = ()
    detokenized_at: float = 0.0


@dataclass(frozen=True, slots=True)
class FlushCacheOut:
    """Reply to `FlushCacheReq` (from the scheduler, forwarded by the detokenizer)."""

    rid: str
    success: bool
    message: str = ""


@dataclass(frozen=True, slots=True)
class GetLoadOut:
    """Reply to `GetLoadReq`."""

    rid: str
    num_running_reqs: int
    num_waiting_reqs: int
    num_used_tokens: int
    max_total_tokens: int
    invariant_violations: int = 0
    num_retracted_reqs: int = 0
    num_waiting_tokens: int = 0  # the waiting requests' prompts (and outputs, if retracted)


@dataclass(frozen=True, slots=True)
class HealthCheckOut:
    """Reply to `HealthCheckReq`."""

    rid: str
    healthy: bool


# ---- the codec's registry --------------------------------------------------------------------

ToSchedulerMsg = (
    TokenizedGenerateReq | AbortReq | FlushCacheReq | GetLoadReq | HealthCheckReq | ShutdownReq
)
ToDetokenizerMsg = BatchTokenIDOut | FlushCacheOut | GetLoadOut | HealthCheckOut | ShutdownReq
ToTokenizerMsg = BatchStrOut | FlushCacheOut | GetLoadOut | HealthCheckOut
Message = ToSchedulerMsg | ToDetokenizerMsg | ToTokenizerMsg

# Wire type tags are positions in this tuple: append new messages, never reorder.
MESSAGE_TYPES: tuple[type, ...] = (
    TokenizedGenerateReq,
    AbortReq,
    FlushCacheReq,
    GetLoadReq,
    HealthCheckReq,
    ShutdownReq,
    BatchTokenIDOut,
    BatchStrOut,
    FlushCacheOut,
    GetLoadOut,
    HealthCheckOut,
)
