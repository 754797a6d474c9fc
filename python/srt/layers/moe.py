"""A sparse mixture-of-experts feed-forward (the shape of Qwen3-MoE, OLMoE, Mixtral): a router
picks each token's `top_k` experts among `num_experts` and weighs them; each expert is a gated
MLP (`make_expert`); the layer's output is the weighted sum of its experts' outputs.

Routing (`route`): logits = x · routerᵀ in float32, softmax over the experts, the `top_k`
largest probabilities, divided by their sum when `renormalize` (Qwen3-MoE's `norm_topk_prob`).
On the CPU one Rust kernel routes (`cpu_kernels.moe_route`), the one the CPU decode executor's
stack calls, so that both pick the same experts with the same weights, bit for bit; elsewhere
PyTorch's operators do. The router's weight is float32 whatever the model's dtype (small beside
the experts), as GGUF files keep it.

The sum: experts in ascending index, each adding its tokens' outputs times their weights into
a float32 accumulator, rounded to the model's dtype at the end (as the stack sums them too).

Under tensor parallelism every rank routes all tokens (the router is replicated) and holds its
share of every expert's intermediate rows, as the dense MLP does; the experts' partial sums are
all-reduced once, after the weighted sum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from srt.distributed import get_tp_group
from srt.kernels.cpu import cpu_kernels
from srt.layers.linear import initializing

if TYPE_CHECKING:
    from srt.layers.linear import Linear


class Expert(Protocol):
    """What the mixture needs of an expert: its fused gate/up and down projections."""

    gate_up_proj: Linear
    down_proj: Linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def route(
    x: torch.Tensor, router: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's (row of `x`'s) `top_k` experts, int64 `[tokens, top_k]` in descending
    weight, and their float32 weights."""
    if cpu_kernels.runs_in_rust(x) and router.is_cpu:
        return cpu_kernels.moe_route(x, router, top_k, renormalize)
    probs = torch.softmax(F.linear(x.float(), router), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


class Router(nn.Module):
    """The router's float32 `[num_experts, hidden_size]` weight (checkpoint name `gate.weight`)."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=torch.float32))
        if initializing():
            nn.init.normal_(self.weight, std=0.02)


@dataclass(frozen=True)
class MoePlan:
    """A mixture as an executor runs it: the router's weight, each expert's projections."""

    router: torch.Tensor
    gate_up: tuple[Linear, ...]
    down: tuple[Linear, ...]
    top_k: int
    renormalize: bool


class SparseMoeBlock(nn.Module):
    """The mixture: `gate` (the router) and `experts` (their checkpoint names)."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        renormalize: bool,
        make_expert: Callable[[], nn.Module],
    ) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top {top_k} of {num_experts} experts")
        self.gate = Router(hidden_size, num_experts)
        self.experts = nn.ModuleList(make_expert() for _ in range(num_experts))
        self.top_k = top_k
        self.renormalize = renormalize
        self.tp = get_tp_group()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = route(x, self.gate.weight, self.top_k, self.renormalize)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for expert in ids.unique().tolist():  # ascending
            tokens, ranks = (ids == expert).nonzero(as_tuple=True)
            y = self.experts[expert](x[tokens])
            out.index_add_(0, tokens, y.float() * weights[tokens, ranks, None])
        return self.tp.all_reduce(out.to(x.dtype))

    def plan(self) -> MoePlan:
        """This rank's mixture, for an executor (`layers/decoder_plan.py`)."""
        experts = [cast("Expert", e) for e in self.experts]
        return MoePlan(
            router=self.gate.weight,
            gate_up=tuple(e.gate_up_proj for e in experts),
            down=tuple(e.down_proj for e in experts),
            top_k=self.top_k,
            renormalize=self.renormalize,
        )
