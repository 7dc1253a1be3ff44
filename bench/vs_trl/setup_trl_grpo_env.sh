#!/usr/bin/env bash
# Creates bench/.venv-trl-grpo: an isolated environment with Hugging Face TRL 1.16 for `python -m bench grpo_vs_trl`
# (setup_trl_env.sh with another version, folder and trainer to check).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BENCH="$(dirname "$HERE")"
TRL_VENV="${TRL_GRPO_VENV:-$BENCH/.venv-trl-grpo}" TRL_VERSION="${TRL_GRPO_VERSION:-1.16.0}" \
    TRL_CHECK="from trl import GRPOConfig, GRPOTrainer" exec bash "$HERE/setup_trl_env.sh"
