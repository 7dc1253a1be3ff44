"""The training commands: ``sft``, ``rm`` and ``dpo`` (each its batch and its loss on the offline loop of
``rlhfkit.training``), and the online RL commands ``ppo``, ``grpo`` and ``rloo`` on one loop (``online/``)."""
