"""Tests of `rlhfkit dpo`."""
