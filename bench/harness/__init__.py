"""What every benchmark uses to run its pieces and record them (runs), and the models and settings the TRL
comparisons share (models); the learning measure of the PPO comparison (gold_eval), the reward both frameworks
load (grpo_reward) and the subprocess that runs rlhfkit with its step clock (rlhfkit_runner)."""
