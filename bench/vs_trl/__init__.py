"""Benchmarks of rlhfkit against Hugging Face TRL: PPO and GRPO on the built-in task's models, every command on
SmolLM2-135M-Instruct. TRL runs in environments of its own (setup_trl_env.sh, setup_trl_grpo_env.sh), through
trl_runner.py and trl_grpo_runner.py; TRL is never a dependency of rlhfkit."""
