#!/usr/bin/env bash
# Creates bench/.venv-trl: an isolated environment with Hugging Face TRL 1.12.0 for `python -m bench ppo_vs_trl`.
# TRL is never a dependency of rlhfkit; it lives only here. torch is installed FIRST and pinned (the local
# CPU wheel) and then passed as a constraint, so that trl's requirements cannot pull the CUDA wheels.
# TRL_VENV, TRL_VERSION and TRL_CHECK (the import it must pass) make it serve other benchmarks too.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BENCH="$(dirname "$HERE")"
VENV="${TRL_VENV:-$BENCH/.venv-trl}"
PY="${PY:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TRL_VERSION="${TRL_VERSION:-1.12.0}"
# What the environment must import (the trainer the benchmark runs).
TRL_CHECK="${TRL_CHECK:-from trl.experimental.ppo import PPOConfig, PPOTrainer}"

export TRL_CHECK
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$TRL_VERSION" <<'PYCHECK' 2>/dev/null; then
import os, sys, peft, trl
exec(os.environ["TRL_CHECK"])
sys.exit(0 if trl.__version__ == sys.argv[1] else 1)
PYCHECK
    echo "bench: $VENV already has trl $TRL_VERSION"
    exit 0
fi

"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "torch==$TORCH_VERSION"
CONSTRAINTS="$VENV/constraints.txt"
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
# peft: the benchmarks' LoRA rows (TRL takes a peft_config)
"$VENV/bin/pip" install -q -c "$CONSTRAINTS" "trl==$TRL_VERSION" peft
"$VENV/bin/python" - <<'PYCHECK'
import os, peft, torch, transformers, trl
exec(os.environ["TRL_CHECK"])
print(f"bench: trl {trl.__version__}, peft {peft.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
PYCHECK
