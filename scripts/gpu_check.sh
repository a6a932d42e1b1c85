#!/usr/bin/env bash
# One prepared GPU check (make gpu-check; DEVICE=cpu runs the same steps on the CPU): the device, the
# operator tests, the attention, prefix and training-memory benchmarks, the MiniLM training step per
# method, and the digits fine-tuning recipe, all on DEVICE. CSVs land in outputs/gpu-check/.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
NTK=${NTK:-.venv/bin/ntk}
PY=${PY:-.venv/bin/python}
OUT=outputs/gpu-check
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

step "device"
$PY -c "import torch; print('torch', torch.__version__, '| cuda available:', torch.cuda.is_available(),
'|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')"
step "operator tests on $DEVICE (tests/test_device.py), operator and adapter tests"
NTK_TEST_DEVICE=$DEVICE $PY -m pytest -q tests/test_device.py tests/test_attention.py tests/test_adapters.py
for suite in attention prefix training-memory finetune; do
  step "ntk bench --suite $suite --device $DEVICE"
  $NTK bench --suite "$suite" --device "$DEVICE" --out "$OUT"
done
step "ntk finetune recipes/digits_vit.yaml --device $DEVICE"
$NTK finetune recipes/digits_vit.yaml --device "$DEVICE" --out "$OUT" --fresh
step "done: CSVs in $OUT/bench/ and $OUT/finetune/digits_vit/"
