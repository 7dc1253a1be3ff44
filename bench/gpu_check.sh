#!/bin/sh
# The equivalence tests on a CUDA device: each training command (sft, rm, dpo, ppo, grpo) under --accel auto
# against --accel off on a tiny Llama, in fp32 with TF32 off (tests/accel/test_auto_off.py, its "cuda" cases).
# Needs python3 with torch (a CUDA build), transformers, peft, accelerate, safetensors, pyyaml, tqdm,
# tensorboard and pytest; nothing is downloaded. Run from anywhere: sh bench/gpu_check.sh [pytest options]
set -e
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" - <<'PY'
import importlib.util, sys
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda available: {torch.cuda.is_available()}"
      + (f" ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else ""))
needed = ["transformers", "peft", "accelerate", "safetensors", "yaml", "tqdm", "pytest"]
missing = [m for m in needed if importlib.util.find_spec(m) is None]
try:
    import torch.utils.tensorboard  # the training logger's writer
except ImportError:
    missing.append("tensorboard")
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)}")
if not torch.cuda.is_available():
    sys.exit("no CUDA device visible to torch")
PY
export RLHFKIT_TEST_GPU=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m pytest -q -s -rs -p no:cacheprovider tests/accel/test_auto_off.py -k cuda "$@"
