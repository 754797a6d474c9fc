"""The soak's request bodies: for each API (`/generate`, `/v1/completions`,
`/v1/chat/completions`), a payload of random words or token ids within the plan's `Shape`, with
the sampling `Options` the plan drew (`soak_traffic.plan_traffic`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from soak_traffic import Shape

STOP_STRINGS = ["\n\n", "."]
SAMPLE_TEXT = (
    "the quick brown fox jumps over a lazy dog while seven bright stars shine above quiet "
    "hills and rivers carry old stories toward distant cities where people read write build "
    "sing and wonder about numbers colors music time light water"
)
WORDS = SAMPLE_TEXT.split()


@dataclass(frozen=True)
class Options:
    """How one planned request samples and ends."""

    output_len: int
    ignore_eos: bool
    temperature: float
    top_p: float | None
    seed: int | None
    n: int
    logprobs: bool
    stop: bool


def _words(rng: random.Random, shape: Shape) -> str:
    # A word is one to three tokens, and a chat template adds a few dozen.
    most = max(1, min(shape.max_prompt_len, (shape.context_length - shape.long_output_len) // 4))
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, most)))


def _ids(rng: random.Random, shape: Shape) -> list[int]:
    most = max(1, min(shape.max_prompt_len, shape.context_length - shape.long_output_len - 1))
    return [rng.randrange(shape.vocab_size) for _ in range(rng.randint(1, most))]


def _openai_params(options: Options, stream: bool, rng: random.Random) -> dict[str, Any]:
    params: dict[str, Any] = {"temperature": options.temperature, "stream": stream}
    if stream and rng.random() < 0.5:
        params["stream_options"] = {"include_usage": True}
    if options.top_p is not None:
        params["top_p"] = options.top_p
    if options.seed is not None:
        params["seed"] = options.seed
    if options.n > 1:
        params["n"] = options.n
    if options.stop:
        params["stop"] = STOP_STRINGS
    if options.ignore_eos:
        params["ignore_eos"] = True
    return params


def _native(
    rng: random.Random, shape: Shape, options: Options, stream: bool
) -> tuple[dict[str, Any], int]:
    params: dict[str, Any] = {
        "max_new_tokens": options.output_len,
        "temperature": options.temperature,
    }
    for name, value in (("top_p", options.top_p), ("seed", options.seed)):
        if value is not None:
            params[name] = value
    if options.n > 1:
        params["n"] = options.n
    if options.stop:
        params["stop"] = STOP_STRINGS
    if options.ignore_eos:
        params["ignore_eos"] = True
    payload: dict[str, Any] = {"sampling_params": params, "stream": stream}
    if rng.random() < 0.3:
        payload["input_ids"] = _ids(rng, shape)
    else:
        payload["text"] = _words(rng, shape)
    if options.logprobs:
        payload |= {"return_logprob": True, "top_logprobs_num": 2}
    return payload, 1


def _completions(
    rng: random.Random, shape: Shape, options: Options, stream: bool
) -> tuple[dict[str, Any], int]:
    roll = rng.random()
    prompt: Any
    if roll < 0.1:
        prompt, prompts = [_words(rng, shape), _words(rng, shape)], 2
    elif roll < 0.2:
        prompt, prompts = _ids(rng, shape), 1
    else:
        prompt, prompts = _words(rng, shape), 1
    payload = {"model": shape.model, "prompt": prompt, "max_tokens": options.output_len}
    payload |= _openai_params(options, stream, rng)
    if options.logprobs:
        payload["logprobs"] = 2
    return payload, prompts


def _chat(
    rng: random.Random, shape: Shape, options: Options, stream: bool
) -> tuple[dict[str, Any], int]:
    messages = [{"role": "user", "content": _words(rng, shape)}]
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": _words(rng, shape)})
    payload = {
        "model": shape.model,
        "messages": messages,
        "max_completion_tokens": options.output_len,
    }
    payload |= _openai_params(options, stream, rng)
    if options.logprobs:
        payload |= {"logprobs": True, "top_logprobs": 2}
    return payload, 1


PAYLOADS = {"generate": _native, "completions": _completions, "chat": _chat}
