"""The online trainers' memory and performance choreography, behind one object with a few hooks.

``OnlineAccel`` is made once by ``rlhfkit.trainers.online.trainer.OnlineTrainer``, which calls it at fixed points
of its step: ``prepare`` (once, after the optimizer is built), ``after_sampling`` and ``after_rollout``; and it
reads ``value_pass`` to know how the value model's passes run. It applies what ``rlhfkit.accel.choices(device)``
lists for the run's device (``kept_heap``, ``value_pass_apart``: the CPU's, under ``--accel auto``); under
``--accel off``, or where they do not apply, it does nothing special: the heap is left to the allocator and the
value model runs in one pass with the policy.

What it does where they apply:
- On the CPU, glibc's malloc keeps the memory freed tensors leave for the next tensors
  (``keep_freed_memory``), and the optimizer's moments are made before the first step, at the bottom of the
  kept heap (``create_optimizer_state``); where the heap cannot be kept, its free pages are handed back
  between the step's phases (``release_freed_memory``).
- A separate value model runs its forward and backward apart from the policy's, in smaller micro-batches, so
  the two networks' activations are never held at once (``ValuePass.APART``); where the rollout's forward is
  reused as epoch 1's, the value model's epoch-1 pass runs with the rollout, which saves its forward without
  gradients (``ValuePass.IN_ROLLOUT``); its gradients then wait for the update's step as the looked-up rows of
  its input embedding only (``sparse_embedding_grads``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from enum import Enum

import torch
from torch import nn

from rlhfkit.accel import choices, on, skipped

VALUE_PASS_SPLIT = 4  # the value model's pass apart runs in micro-batches this many times smaller


class Networks(Enum):
    """Which networks of an actor-critic with a separate value model a forward pass runs
    (``rlhfkit.trainers.online.policy.ActorCritic``)."""

    ALL = "all"
    """The policy and the value function."""
    POLICY = "policy"
    """The policy alone (the values come out None)."""
    VALUE = "value"
    """The separate value model alone (the log-probs and entropies come out None)."""


class ValuePass(Enum):
    """How a separate value model's forward and backward run in the update."""

    JOINT = "joint"
    """With the policy's, in one pass over both networks (and a separate no-grad pass for the rollout's values)."""
    APART = "apart"
    """After the policy's, in micro-batches ``VALUE_PASS_SPLIT`` times smaller."""
    IN_ROLLOUT = "in_rollout"
    """Apart, and epoch 1's pass runs with the rollout, its values the rollout's values."""


class OnlineAccel:
    """The performance choices of one online-RL run and the hooks that apply them.

    ``device``: the run's device. ``value_model``: a separate value model (None for a value head or no critic).
    ``value_pass_apart``: the option asking for the value model's pass apart. ``single_process``: one process
    without a sharding engine (several processes' gradient sync expects one backward per micro-batch).
    ``first_pass_reused``: the rollout's forward with gradients stands in for epoch 1's (one minibatch).
    ``critic``: the advantage estimator reads values, each row's returns from that row alone (then epoch 1's value
    pass can run with the rollout, a chunk of rows at a time)."""

    def __init__(
        self,
        device: torch.device,
        *,
        value_model: nn.Module | None,
        value_pass_apart: bool,
        single_process: bool,
        first_pass_reused: bool,
        critic: bool,
    ):
        chosen = choices(device)
        self.keeps_heap = chosen.kept_heap and keep_freed_memory()
        self.trims_heap = chosen.kept_heap and not self.keeps_heap
        self.value_model = value_model
        self.value_pass = ValuePass.JOINT
        if chosen.value_pass_apart and value_pass_apart and value_model is not None and single_process:
            in_rollout = first_pass_reused and critic and not skipped("value_pass_in_rollout")
            self.value_pass = ValuePass.IN_ROLLOUT if in_rollout else ValuePass.APART

    @property
    def value_apart(self) -> bool:
        """Whether the value model's passes run apart from the policy's."""
        return self.value_pass is not ValuePass.JOINT

    def value_rows(self, rows: int) -> int:
        """Rows of each of the value model's micro-batches when its pass runs apart on ``rows`` rows."""
        return max(1, -(-rows // VALUE_PASS_SPLIT))

    @property
    def first_pass_networks(self) -> Networks:
        """The networks of the rollout's forward that stands in for epoch 1's."""
        return Networks.POLICY if self.value_apart else Networks.ALL

    def update_passes(self, micro_rows: int, value_done: bool) -> list[tuple[Networks, int]]:
        """The forward and backward passes of one minibatch, as (networks, rows per micro-batch): one joint pass;
        or the policy's, then the value model's in smaller micro-batches unless ``value_done`` (it ran with the
        rollout)."""
        if not self.value_apart:
            return [(Networks.ALL, micro_rows)]
        return [(Networks.POLICY, micro_rows)] + ([] if value_done else [(Networks.VALUE, self.value_rows(micro_rows))])

    def prepare(self, optimizer) -> None:
        """Once, after the optimizer is built (and wrapped): its moments made now, low in the kept heap below every
        step's short-lived tensors; the value model's embedding gradients sparse while they wait for the step."""
        if self.keeps_heap and not skipped("early_optimizer_state"):
            create_optimizer_state(optimizer)
        if self.value_pass is ValuePass.IN_ROLLOUT:
            sparse_embedding_grads(self.value_model)

    def after_sampling(self) -> None:
        """After step 1: the sampler's key / value buffers are freed."""
        if self.trims_heap:
            release_freed_memory()

    def after_rollout(self) -> None:
        """After steps 2-6: the teacher-forced passes' activations are freed (all but a reused first pass's)."""
        if self.trims_heap:
            release_freed_memory()


# ---- the heap ------------------------------------------------------------------------------------------------
@functools.cache
def _glibc():
    """The C library when it is glibc (it has ``malloc_trim`` and ``mallopt``), else None (macOS, musl, Windows)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the operating system (glibc's ``malloc_trim``; elsewhere nothing).

    Tensors larger than glibc's mmap threshold are first given their own mappings, but once one is freed the
    threshold rises to its size, so later tensors of that size come from the heap, and the heap keeps what they
    free. An online step frees whole phases' worth of them (the decode step's key / value buffers after
    sampling, the teacher-forced passes' activations before the update), and the next phase's tensors would
    otherwise come on top of those pages in the process's resident size."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


# glibc's mallopt parameters (malloc.h) and the values keep_freed_memory sets
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
HEAP_TOP_PAD = 64 << 20  # the heap grows by at least this much at a time
HEAP_TRIM_THRESHOLD = (1 << 31) - 1  # the top of the heap is not handed back while the process runs


def _user_malloc_settings() -> bool:
    """Whether the environment already tunes glibc's malloc (or swaps the allocator): those are left alone."""
    env = os.environ
    return (
        "glibc.malloc." in env.get("GLIBC_TUNABLES", "")
        or any(k.startswith("MALLOC_") and k.endswith("_") for k in env)
        or any(name in env.get("LD_PRELOAD", "") for name in ("jemalloc", "tcmalloc", "mimalloc"))
    )


def keep_freed_memory() -> bool:
    """Have glibc keep the memory freed tensors leave for the next tensors, instead of returning it to the
    operating system; returns whether it did (glibc, no malloc settings in the environment, the performance code
    on). Process-wide, for the rest of the process.

    A page the operating system hands (back) to the process costs a page fault and a zero-fill at its first
    touch, a page at a time. By default glibc returns the freed top of the heap once it exceeds twice the
    (moving) mmap threshold, maps tensors above that threshold fresh each time, and ``malloc_trim`` returns every
    free page, so each phase of an online step faults in the pages the previous one gave back. With every tensor
    taken from the heap (no mappings of their own) and the heap's freed memory kept, each phase reuses the pages
    the previous one freed. The resident size then stays near its peak between phases; the peak itself is what
    the phases need at once, plus what fragmentation leaves unusable."""
    libc = _glibc()
    if libc is None or not on("kept_heap") or _user_malloc_settings():
        return False
    return all(
        libc.mallopt(param, value) == 1
        for param, value in (
            (_M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD),
            (_M_TOP_PAD, HEAP_TOP_PAD),
            (_M_MMAP_MAX, 0),  # no tensor gets a mapping of its own (unless the heap cannot grow)
        )
    )


# ---- the optimizer and the gradients ---------------------------------------------------------------------------


def create_optimizer_state(optimizer) -> int:
    """Have an Adam / AdamW ``optimizer`` (or accelerate's wrapper of one) create its per-parameter state, the
    moments, now rather than at its first step; returns for how many parameters. Every value is then what the
    first step would have created: one step with zero gradients, the learning rate and weight decay 0 (moments
    0, parameters unchanged), then the step counts set back to 0.

    Where freed memory stays in the process's heap (``keep_freed_memory``), tensors made early sit at its
    bottom, and the step's short-lived ones reuse the space above them. Made at the first step instead, twice
    the trainable parameters' size lands in the holes the first step's activations left, and the peak resident
    size of later steps is higher."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
    if type(inner) not in (torch.optim.Adam, torch.optim.AdamW):
        return 0
    params = [p for g in inner.param_groups for p in g["params"] if p.requires_grad and not inner.state.get(p)]
    if not params or any(p.grad is not None or type(p.data) is not torch.Tensor for p in params):
        return 0  # gradients already there, or sharded parameters (FSDP's DTensors): left to the first step
    sizes: dict = {}  # one read-only zero buffer per dtype and device, shared by every parameter's gradient
    for p in params:
        sizes[p.dtype, p.device] = max(sizes.get((p.dtype, p.device), 0), p.numel())
    zeros = {key: torch.zeros(n, dtype=key[0], device=key[1]) for key, n in sizes.items()}
    settings = [(g["lr"], g["weight_decay"]) for g in inner.param_groups]
    try:
        for p in params:
            p.grad = zeros[(p.dtype, p.device)][: p.numel()].view_as(p)
        for g in inner.param_groups:
            g["lr"], g["weight_decay"] = 0.0, 0.0
        inner.step()
    finally:
        for g, (lr, weight_decay) in zip(inner.param_groups, settings):
            g["lr"], g["weight_decay"] = lr, weight_decay
        for p in params:
            p.grad = None
    for p in params:
        state = inner.state[p]
        if torch.is_tensor(state.get("step")):
            state["step"].zero_()
        elif "step" in state:
            state["step"] = 0
    return len(params)


def sparse_embedding_grads(model: nn.Module) -> int:
    """Give the input embeddings of ``model`` (plain ``nn.Embedding`` layers) sparse gradients: the looked-up
    rows only, until ``rlhfkit.training.updates.step`` makes them dense (the optimizers take dense gradients).
    Where a model's gradients are held for a while before the step (the value model's pass in the rollout), its
    ``[vocab, hidden]`` gradient then holds only the looked-up rows until the step. Returns how many layers
    changed."""
    changed = 0
    for module in model.modules():
        if type(module) is nn.Embedding and module.max_norm is None and not module.sparse:
            module.sparse = True
            changed += 1
    return changed
