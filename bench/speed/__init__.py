"""Benchmarks of rlhfkit's own speed and memory: where a step's time goes (profile_ppo, against the FLOP floor of
flops.py), what each piece of rlhfkit/accel buys, the GPU, vLLM's engine, adapter loading, memory at a real
vocabulary and per GPU, and multi-turn rollouts."""
