"""Tensor parallelism's process group (`parallel_state`): who this rank is, and the collectives
the layers (all-reduce, all-gather) and the scheduler (broadcast of what rank 0 received) use."""

from srt.distributed.parallel_state import (
    TPGroup,
    get_tp_group,
    init_tensor_parallel,
    kv_heads_per_rank,
    set_tp_group,
)

__all__ = ["TPGroup", "get_tp_group", "init_tensor_parallel", "kv_heads_per_rank", "set_tp_group"]
