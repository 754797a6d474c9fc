"""The TokenizerManager's SGLang-shaped results as `GenerateResponse` messages.

A streamed call gets, per sample, a `GenerateStreamChunk` with the ids each result added (and
their logprobs; the prompt's logprobs once), then a `GenerateComplete` with all of its ids and
why it ended; a call that does not stream gets the `GenerateComplete`s alone. Counts are running
totals, as the TokenizerManager keeps them. A sample the scheduler refused (an abort carrying
an HTTP status) is not a completion: `refusal` gives the gRPC status the call ends with.

SGLang's messages have no field for a request's stage times: with `--enable-metrics` (which puts
them in the results) the call's trailing metadata carries them, `srt-stage-latencies`, a JSON
object of each sample's seconds per stage (`managers/request_times.py`), by index.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from srt.entrypoints.grpc.requests import grpc_field

STAGE_LATENCIES_KEY = "srt-stage-latencies"
# The HTTP status of a scheduler's refusal → the gRPC status the call ends with.
REFUSALS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


@dataclass
class SampleOutput:
    """What one sample of a streamed call has produced so far: its `GenerateComplete` repeats
    every id and output logprob."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[Any] = field(default_factory=list)


class ResponseBuilder:
    """Builds the messages of one `Generate` call from its results (`pb`: the generated
    message module)."""

    def __init__(self, pb: Any, request_id: str, return_logprob: bool) -> None:
        self.pb = pb
        self.request_id = request_id
        self.return_logprob = return_logprob
        self.samples: dict[int, SampleOutput] = {}
        self.stage_latencies: dict[int, dict[str, float]] = {}

    def chunk(self, result: Mapping[str, Any], index: int) -> Any:
        """The `GenerateStreamChunk` of one streamed result: the ids (and logprobs) it adds."""
        meta = result["meta_info"]
        sample = self.samples.setdefault(index, SampleOutput())
        sample.ids += result["output_ids"]
        chunk = self.pb.GenerateStreamChunk(
            token_ids=result["output_ids"],
            prompt_tokens=meta["prompt_tokens"],
            completion_tokens=meta["completion_tokens"],
            cached_tokens=meta["cached_tokens"],
            index=index,
        )
        if self.return_logprob:
            logprobs = self.output_logprobs(meta)
            sample.logprobs += logprobs.token_logprobs
            sample.top_logprobs += logprobs.top_logprobs
            chunk.output_logprobs.CopyFrom(logprobs)
            if meta.get("input_token_logprobs"):
                chunk.input_logprobs.CopyFrom(self.input_logprobs(meta))
        return self.pb.GenerateResponse(request_id=self.request_id, chunk=chunk)

    def complete(self, result: Mapping[str, Any], index: int, streamed: bool) -> Any:
        """The `GenerateComplete` of a finished sample: of its last streamed result (the
        sample's ids gathered from its chunks) or of its one final result."""
        meta = result["meta_info"]
        reason = meta["finish_reason"]
        if "stage_latencies" in meta:
            self.stage_latencies[index] = meta["stage_latencies"]
        complete = self.pb.GenerateComplete(
            finish_reason=reason["type"],
            prompt_tokens=meta["prompt_tokens"],
            completion_tokens=meta["completion_tokens"],
            cached_tokens=meta["cached_tokens"],
            index=index,
        )
        matched = reason.get("matched")
        if isinstance(matched, str):
            complete.matched_stop_str = matched
        elif isinstance(matched, int):
            complete.matched_token_id = matched
        if streamed:
            sample = self.samples.pop(index, SampleOutput())
            complete.output_ids.extend(sample.ids)
            if self.return_logprob:
                complete.output_logprobs.token_logprobs.extend(sample.logprobs)
                complete.output_logprobs.token_ids.extend(sample.ids)
                complete.output_logprobs.top_logprobs.extend(sample.top_logprobs)
        else:
            complete.output_ids.extend(result["output_ids"])
            if self.return_logprob:
                complete.output_logprobs.CopyFrom(self.output_logprobs(meta))
                if meta.get("input_token_logprobs"):
                    complete.input_logprobs.CopyFrom(self.input_logprobs(meta))
        return self.pb.GenerateResponse(request_id=self.request_id, complete=complete)

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        """The call's trailing metadata: the samples' stage times, when the results had them."""
        if not self.stage_latencies:
            return ()
        return ((STAGE_LATENCIES_KEY, json.dumps(self.stage_latencies)),)

    def output_logprobs(self, meta: Mapping[str, Any]) -> Any:
        """`OutputLogProbs` of SGLang's `output_token_logprobs` and `output_top_logprobs`
        (`(logprob, id, text)` triples)."""
        out = self.pb.OutputLogProbs(
            token_logprobs=[logprob for logprob, _, _ in meta["output_token_logprobs"]],
            token_ids=[token for _, token, _ in meta["output_token_logprobs"]],
        )
        for top in meta.get("output_top_logprobs") or []:
            out.top_logprobs.append(self.top_logprobs(top))
        return out

    def input_logprobs(self, meta: Mapping[str, Any]) -> Any:
        """`InputLogProbs` of SGLang's `input_token_logprobs` (the first position's logprob
        None: left unset) and `input_top_logprobs` (None there: an empty entry)."""
        out = self.pb.InputLogProbs()
        for logprob, token, _ in meta["input_token_logprobs"]:
            entry = out.token_logprobs.add()
            if logprob is not None:
                entry.value = logprob
            out.token_ids.append(token)
        for top in meta.get("input_top_logprobs") or []:
            out.top_logprobs.append(self.top_logprobs(top or []))
        return out

    def top_logprobs(self, top: list[Any]) -> Any:
        return self.pb.TopLogProbs(
            values=[logprob for logprob, _, _ in top], token_ids=[token for _, token, _ in top]
        )


def refusal(finish_reason: Mapping[str, Any] | None) -> tuple[grpc.StatusCode, str] | None:
    """The status and message a call ends with when the scheduler refused its request (an
    abort with an HTTP status; its message names the field, if one is to blame), else None."""
    if finish_reason is None or finish_reason.get("type") != "abort":
        return None
    status = finish_reason.get("status_code") or 0
    if status < 400:
        return None
    code = REFUSALS.get(status, grpc.StatusCode.INTERNAL)
    message = str(finish_reason.get("message", ""))
    param = grpc_field(finish_reason.get("param") or None)
    return code, f"{param}: {message}" if param else message
