"""The workloads of `bench_serving.py`, as SGLang's `bench_serving` builds them: each a list of
`BenchRequest`s (prompt text, its token count, the output tokens to ask for).

- random: prompts of random token ids decoded by the tokenizer, input and output lengths drawn
  uniformly from [len * range_ratio, len];
- generated-shared-prefix: groups of prompts sharing one system prompt, each followed by its own
  question;
- sharegpt: the first human turn of each conversation of a ShareGPT-format JSON file as the
  prompt, the token count of the first gpt turn after it as the output length.

`best_cache_hit_rate` says how much of a workload a perfect prefix cache could serve.

Tokens are counted with Hugging Face `tokenizers` on the model's `tokenizer.json` (what
transformers' fast tokenizers run), which spares the benchmark process importing torch.
"""

from __future__ import annotations

import bisect
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer


class BenchTokenizer:
    """A model's tokenizer, from its directory (or its `tokenizer.json`)."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(
                f"no tokenizer at {path}: --tokenizer needs a local directory holding "
                "tokenizer.json (a Hugging Face fast tokenizer), or that file"
            )
        self.tokenizer = Tokenizer.from_file(str(file))
        self.special_ids = frozenset(
            i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special
        )

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def ordinary_ids(self) -> list[int]:
        """Every id that is not a special token: what random prompts are made of."""
        size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        return [i for i in range(size) if i not in self.special_ids]


@dataclass(frozen=True, slots=True)
class BenchRequest:
    prompt: str
    prompt_len: int
    """Tokens of `prompt` as the tokenizer encodes it, special tokens included."""
    output_len: int


def prompt_token_ids(tokenizer: BenchTokenizer, prompt: str) -> list[int]:
    """The ids a server tokenizing `prompt` for a completion sees (BOS included where the
    tokenizer adds one)."""
    return tokenizer.encode(prompt, add_special_tokens=True)


def random_text(tokenizer: BenchTokenizer, rng: random.Random, n: int, pool: Sequence[int]) -> str:
    """Text of random tokens that re-encodes to `n` tokens where a few rounds of trimming and
    topping up reach it (decoded ids can merge or split when encoded again); never empty."""
    ids = [rng.choice(pool) for _ in range(n)]
    text = tokenizer.decode(ids)
    for _ in range(8):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == n:
            break
        ids = ids[:n] if len(ids) > n else ids + [rng.choice(pool) for _ in range(n - len(ids))]
        candidate = tokenizer.decode(ids)
        if not candidate:
            break
        text = candidate
    return text


def draw_lengths(rng: random.Random, n: int, length: int, range_ratio: float) -> list[int]:
    """`n` lengths uniform in [max(1, int(length * range_ratio)), length], as SGLang draws
    them."""
    if length < 1:
        raise ValueError(f"a length must be at least 1, got {length}")
    if not 0.0 <= range_ratio <= 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1], got {range_ratio}")
    low = max(1, int(length * range_ratio))
    return [rng.randint(low, length) for _ in range(n)]


def random_requests(
    tokenizer: BenchTokenizer,
    rng: random.Random,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
) -> list[BenchRequest]:
    pool = tokenizer.ordinary_ids()
    input_lens = draw_lengths(rng, num_prompts, input_len, range_ratio)
    output_lens = draw_lengths(rng, num_prompts, output_len, range_ratio)
    requests = []
    for n_in, n_out in zip(input_lens, output_lens, strict=True):
        prompt = random_text(tokenizer, rng, n_in, pool)
        requests.append(BenchRequest(prompt, len(prompt_token_ids(tokenizer, prompt)), n_out))
    return requests


def shared_prefix_requests(
    tokenizer: BenchTokenizer,
    rng: random.Random,
    num_groups: int,
    prompts_per_group: int,
    system_prompt_len: int,
    question_len: int,
    output_len: int,
) -> list[BenchRequest]:
    """SGLang's generated-shared-prefix: `num_groups` system prompts of `system_prompt_len`
    random tokens, each followed by `prompts_per_group` questions of `question_len` tokens,
    group after group."""
    for name, value in (
        ("--gsp-num-groups", num_groups),
        ("--gsp-prompts-per-group", prompts_per_group),
        ("--gsp-system-prompt-len", system_prompt_len),
        ("--gsp-question-len", question_len),
        ("--gsp-output-len", output_len),
    ):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    pool = tokenizer.ordinary_ids()
    requests = []
    for _ in range(num_groups):
        system = random_text(tokenizer, rng, system_prompt_len, pool)
        for _ in range(prompts_per_group):
            prompt = f"{system}\n\n{random_text(tokenizer, rng, question_len, pool)}"
            requests.append(
                BenchRequest(prompt, len(prompt_token_ids(tokenizer, prompt)), output_len)
            )
    return requests


def _first_exchange(conversation: Any) -> tuple[str, str] | None:
    """The first human turn and the first gpt turn after it, if the conversation has both."""
    turns = conversation.get("conversations") if isinstance(conversation, dict) else None
    if not isinstance(turns, list):
        return None
    prompt = None
    for turn in turns:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            continue
        speaker = turn.get("from")
        if prompt is None and speaker in ("human", "user"):
            prompt = turn["value"]
        elif prompt is not None and speaker in ("gpt", "assistant"):
            return prompt, turn["value"]
    return None


def sharegpt_requests(
    tokenizer: BenchTokenizer,
    rng: random.Random,
    path: Path,
    num_prompts: int,
    max_prompt_len: int = 1024,
    max_total_len: int = 2048,
) -> list[BenchRequest]:
    """`num_prompts` conversations drawn at random from a ShareGPT-format file. As in SGLang,
    exchanges with a prompt or answer under 4 tokens, a prompt over `max_prompt_len` or both
    over `max_total_len` are left out."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read the ShareGPT file {path}: {e}") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from e
    if not isinstance(data, list):
        raise ValueError(f"{path} must hold a JSON list of conversations")
    exchanges = [x for x in map(_first_exchange, data) if x is not None]
    if not exchanges:
        raise ValueError(
            f"{path} has no conversation with a human turn followed by a gpt turn "
            '(each item: {"conversations": [{"from": "human", "value": ...}, ...]})'
        )
    rng.shuffle(exchanges)
    requests: list[BenchRequest] = []
    for prompt, answer in exchanges:
        if len(requests) == num_prompts:
            break
        prompt_len = len(prompt_token_ids(tokenizer, prompt))
        output_len = len(tokenizer.encode(answer, add_special_tokens=False))
        if prompt_len < 4 or output_len < 4:
            continue
        if prompt_len > max_prompt_len or prompt_len + output_len > max_total_len:
            continue
        requests.append(BenchRequest(prompt, prompt_len, output_len))
    if len(requests) < num_prompts:
        raise ValueError(
            f"{path} has {len(requests)} usable conversations, fewer than --num-prompts "
            f"{num_prompts}"
        )
    return requests


def best_cache_hit_rate(prompts: Sequence[Sequence[int]]) -> float:
    """The share of prompt tokens a perfect prefix cache could serve when the prompts arrive in
    this order: each prompt's longest common prefix with any earlier prompt, short of its last
    token (a server must compute at least one token to produce logits), over all tokens."""
    total = sum(len(p) for p in prompts)
    if total == 0:
        return 0.0
    seen: list[tuple[int, ...]] = []
    reusable = 0
    for prompt in prompts:
        key = tuple(prompt)
        at = bisect.bisect_left(seen, key)
        # In sorted order, the longest common prefix with any earlier prompt is with a neighbour.
        best = max(
            (_common_prefix(key, seen[i]) for i in (at - 1, at) if 0 <= i < len(seen)),
            default=0,
        )
        reusable += min(best, max(len(key) - 1, 0))
        seen.insert(at, key)
    return reusable / total


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
