#!/usr/bin/env bash
# The GPU steps still to run, by name, on the GPU machine after `scripts/device/install.sh` (docs/architecture.md,
# "Testing on a GPU"); each writes its rows and a tarball of its logs under $OUT, which the call brings back.
#   VLMTRAIN_COMMIT=<sha> bash scripts/device/steps.sh STEP
# The steps, in the order to run them from the head whenever a GPU is at hand (each fits one 10-minute call on one
# H100; minutes as measured on one, 2026-12-07, machine run boot-ee033fa5, after install.sh's ~70 s):
#   gdn_varlen    the Gated DeltaNet's kernels packed vs each segment alone (vlmtrain lab gdn-varlen) at H2's and the tiny
#                 model's shapes: not yet run; seconds of GPU work after FLA's first compile (the h2l2 first step's
#                 compile took 120-153 s cold), so about 3-5 minutes on a fresh machine
#   pack35tiny    packing equivalence of tiny Qwen3.5 (Gated DeltaNet + attention, boundaries controls); its row is
#                 rewritten after every measured state, the case stops at BUDGET_S (default 540). Passed: 6.2 min
#                 on a cold kernel cache (one training round)
#   pack35h2l2    packing equivalence at H2's layer shapes, 2 layers (one Gated DeltaNet, one attention): 6.8 min to
#                 its first state on a cold cache; BUDGET_S=540 for a training round after it
#   h2l2 SWEEP    a sweep of conf/tune/perf_h100.yaml (Qwen3.5 shapes at 2 layers, each lever alone against the
#                 defaults, runs alternating, 3 each): about 70 s a run warm, 114 s the first; a call stops before
#                 BUDGET_S (540) and the same step on the same machine resumes it (h2l2_vit_levers: 12 runs, 2 calls)
#   profile_ab    h2l2 unprofiled, then with train.profile_step=6 (PROFILE_EXTRA: e.g. train.profile_stacks=true):
#                 how much the profiler stretches the profiled step and the others; about 3 min warm
#   h2 SWEEP      on an H200: a sweep of conf/tune/perf_h200.yaml at benchmark H2 (defaults_h2: H2's defaults and
#                 experiment=perf_h200_qwen35, alternating, 3 runs each): not yet run; H2 took 5.9 s a step unpacked
#                 (2026-12-04), so about 2.5 minutes a run: two calls
#   h2_bridge     on an H200: Megatron Bridge's own recipe at H2, 3 runs (vlmtrain lab bridge-recipe --benchmark h2)
#                 and its vs_bridge_recipe; not yet run
#   verify35      Qwen3.5 HF round trip, VERIFY_CHECKS of vlmtrain.lab.checks.verification (default parity_import
#                 parity_trained; a whole family takes three calls: "parity_import parity_trained reload frozen",
#                 then "resume", then "export_fsdp reload_fsdp frozen_fsdp"; about 20 min of calls per family)
#   verify3vl     verify35's checks for Qwen3-VL-MoE (the same checkpoint builder, its 1-D weights spread)
set -uo pipefail
step=${1:?usage: steps.sh STEP}
export PYTHONPATH=/tmp/site:$PWD/src NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 VLMTRAIN_COMMIT=${VLMTRAIN_COMMIT:-unknown}
OUT=${OUT:?run on the device machine, where OUT is set}
# A rank left over from an earlier call holds GPU memory: kill what nvidia-smi lists first (a throwaway machine
# only: never on a shared node).
for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
# Sweep rows of earlier calls on this warm machine, so a repeated step resumes (the schedule skips recorded runs).
restore() { mkdir -p /tmp/keep && touch "/tmp/keep/$1.jsonl" && cp "/tmp/keep/$1.jsonl" "$OUT/perf_h200.jsonl"; }
keep() { cp "$OUT/perf_h200.jsonl" "/tmp/keep/$1.jsonl"; }
logs() { (cd "$1" && find . -maxdepth 3 \( -name '*.log' -o -name '*.json' \) -print0 |
  tar czf "$OUT/$step-logs.tgz" --null -T -); }
case $step in
  verify35|verify3vl)
    family=$([ "$step" = verify35 ] && echo qwen35_vl || echo qwen3_vl)
    timeout 560 python3 -m vlmtrain.cli lab verification --families "$family" \
      --checks ${VERIFY_CHECKS:-parity_import parity_trained} --results "$OUT/verification.jsonl" --work /tmp/verif
    rc=$?
    logs /tmp/verif
    ;;
  gdn_varlen)
    rc=0
    for model in qwen35_vl_35b_a3b tiny_qwen35; do
      timeout 280 python3 -m vlmtrain.cli lab gdn-varlen --model "$model" --results "$OUT/gdn_varlen.jsonl" || rc=$?
    done
    ;;
  pack35tiny|pack35h2l2)
    case=$([ "$step" = pack35tiny ] && echo tiny-qwen35_kernels-default || echo h2-shape-l2-gdn-attn_kernels-default)
    timeout 590 python3 -m vlmtrain.cli lab packing-equivalence --only "$case" --budget-s "${BUDGET_S:-540}" \
      --results "$OUT/packing_equivalence.jsonl"
    rc=$?
    logs "outputs/packing_equivalence/$case"
    ;;
  h2l2|h2)
    sweep=${2:?usage: steps.sh $step SWEEP}
    spec=$([ "$step" = h2l2 ] && echo perf_h100 || echo perf_h200)
    restore "$spec"
    timeout 590 python3 -m vlmtrain.cli sweep "$spec" --sweep "$sweep" --budget-s "${BUDGET_S:-540}" \
      --results "$OUT/perf_h200.jsonl" --out /tmp/runs
    rc=$?
    keep "$spec"
    logs /tmp/runs
    ;;
  h2_bridge)
    restore perf_h200
    timeout 590 python3 -m vlmtrain.cli lab bridge-recipe --benchmark h2 --repeats 3 --budget-s "${BUDGET_S:-540}" \
      --results "$OUT/perf_h200.jsonl" --out /tmp/bridge
    rc=$?
    keep perf_h200
    logs /tmp/bridge
    ;;
  profile_ab)
    timeout 590 python3 -m vlmtrain.cli lab profile-step --spec perf_h100 --case h2l2 --step 6 --ab 1 \
      --extra ${PROFILE_EXTRA:-} --results "$OUT/profile_h100.jsonl" --out /tmp/prof
    rc=$?
    logs /tmp/prof
    ;;
  *) echo "unknown step $step"; exit 2;;
esac
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
echo "[steps] $step rc $rc"
exit $rc
