"""The sharding engines that ``accelerate launch`` selects (DDP, FSDP2, DeepSpeed ZeRO), and what the
trainers do differently under each.

The trainers call ``accelerator.prepare`` and never build an engine themselves: the engine comes from the
launcher's accelerate config (``examples/accelerate/*.yaml``). What depends on it is kept here:

* ``full_state_dict``: the whole model's weights for the final Hugging Face directory. Under FSDP2 and
  ZeRO-3 every process holds a shard, so gathering is a collective: every rank calls it, rank 0 writes.
* ``gathered_for_generation``: sampling runs one forward per token, and ranks sample different lengths.
  Under FSDP2 the parameters are gathered once for the whole rollout (and kept gathered between forwards);
  under ZeRO-3 through ``deepspeed.zero.GatheredParameters``. Gathering once is faster than once per token,
  and it is also what lets ranks decode different numbers of tokens without mismatched collectives.
* ``sharded``: whether checkpoints must be written by every rank (FSDP2: ``torch.distributed.checkpoint``,
  one shard file per rank) instead of by rank 0 from an unwrapped model.
* Frozen models (the reference, the reward model) are never sharded: each process keeps a full copy,
  without optimizer state (under ZeRO-3 with very large models, pass a LoRA policy, whose reference is the
  shared backbone).

accelerate runs FSDP only on GPUs and DeepSpeed only with its own accelerator; ``use_fsdp_on_cpu`` lets
CPU processes take the same FSDP2 path (``fully_shard`` works over gloo), which is how it is tested on
machines without a GPU.
"""

from __future__ import annotations

import contextlib
import os

import torch


def engine(accelerator) -> str:
    """'fsdp2', 'fsdp1', 'deepspeed', 'ddp' (any other multi-process), or 'single'."""
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.FSDP:
        return "fsdp2" if accelerator.is_fsdp2 else "fsdp1"
    if kind == DistributedType.DEEPSPEED:
        return "deepspeed"
    return "ddp" if accelerator.num_processes > 1 else "single"


def zero_stage(accelerator) -> int:
    if engine(accelerator) != "deepspeed":
        return 0
    return int(accelerator.state.deepspeed_plugin.zero_stage)


def sharded(accelerator) -> bool:
    """Parameters live in shards across processes (FSDP, ZeRO-3)."""
    return engine(accelerator) in ("fsdp1", "fsdp2") or zero_stage(accelerator) == 3


def use_fsdp_on_cpu(accelerator) -> None:
    """When the launcher asked for FSDP (``ACCELERATE_USE_FSDP``) but accelerate set up plain CPU processes
    (it enables FSDP on GPUs only), switch the state to FSDP2 with the plugin the launcher's environment
    describes, so ``prepare`` shards the model exactly as on GPUs."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    asked = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if not asked or accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    from accelerate.state import PartialState

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    state = AcceleratorState()
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # read back by later calls


def full_state_dict(accelerator, model) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on rank 0 (None on the others under sharding engines). Every rank must
    call it: under FSDP/ZeRO-3 it is a collective."""
    if not sharded(accelerator):
        return accelerator.unwrap_model(model).state_dict() if accelerator.is_main_process else None
    return accelerator.get_state_dict(model, unwrap=True)


@contextlib.contextmanager
def gathered_for_generation(accelerator, model):
    """Full parameters on every rank for the duration of a rollout's sampling (see the module docstring)."""
    kind = engine(accelerator)
    if kind == "fsdp2":
        modules = [m for m in model.modules() if hasattr(m, "unshard") and hasattr(m, "set_reshard_after_forward")]
        before = [_reshards_after_forward(m) for m in modules]
        for m in modules:
            m.set_reshard_after_forward(False, recurse=False)
        for m in modules:
            m.unshard()
        try:
            yield model
        finally:
            for m, reshard in zip(modules, before):
                m.reshard()
                m.set_reshard_after_forward(reshard, recurse=False)
    elif kind == "deepspeed" and zero_stage(accelerator) == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            yield model
    else:
        yield model


def _reshards_after_forward(module) -> bool:
    """Whether an FSDP2 module frees its gathered parameters after each forward (the root does not)."""
    group = module._get_fsdp_state()._fsdp_param_group
    return group is not None and group.post_forward_mesh_info is not None


def save_sharded(folder, models: dict, optimizer=None) -> None:
    """Every rank writes its shards of ``models`` (name -> module) and ``optimizer`` into ``folder``
    (``torch.distributed.checkpoint``: one file per rank plus a small index; a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {f"model/{name}": get_model_state_dict(model) for name, model in models.items()}
    if optimizer is not None:
        (name, model), *_ = models.items()
        state["optimizer"] = get_optimizer_state_dict(model, _inner(optimizer))
    dcp.save(state, checkpoint_id=str(folder))


def load_sharded(folder, models: dict, optimizer=None) -> None:
    """Read ``save_sharded``'s files back into ``models`` and ``optimizer`` (every rank its shards)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = {f"model/{name}": get_model_state_dict(model) for name, model in models.items()}
    if optimizer is not None:
        (name, model), *_ = models.items()
        state["optimizer"] = get_optimizer_state_dict(model, _inner(optimizer))
    dcp.load(state, checkpoint_id=str(folder))
    for name, model in models.items():
        set_model_state_dict(model, state[f"model/{name}"])
    if optimizer is not None:
        set_optimizer_state_dict(next(iter(models.values())), _inner(optimizer), state["optimizer"])


def _inner(optimizer):
    """The torch optimizer inside accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)
