"""Models: loading local Hugging Face folders (and ``.gguf`` files), ``init-model``, LoRA adapters and saving,
reward models and their scores, the sampler, the teacher-forced forward passes the trainers share, and the vLLM
rollout engine. Plain PyTorch and transformers throughout; the functions marked ``@replaceable``
(``fastpath.py``) are where ``rlhfkit.accel`` may stand in a faster implementation of the same numbers."""
