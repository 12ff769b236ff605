#!/usr/bin/env bash
# Re-create the embedded assets of the adapted CommonGen pipeline (docs/hmm.md has the measured
# time of each stage on a 2-core CPU):
#   1. the unsupervised CommonGen LoRA adapter  -> ctrlg/assets/adapter_smollm2_commongen
#   2. the supervised one (concepts -> sentence) -> ctrlg/assets/adapter_smollm2_commongen_supervised
#   3. the HMM distilled from the adapted LM's unconditional samples (+ its prior head)
#                                                -> ctrlg/assets/hmm_smollm2_commongen_adapted
#   4. the supervised LM's prior head for that HMM (after 3: a head is tied to its HMM's save_id)
#                                                -> ctrlg/assets/prior_head_smollm2_commongen_supervised
#   5. the unsupervised recipe on the human-written train captions
#                                                -> ctrlg/assets/adapter_smollm2_commongen_human
#   6. its HMM: the embedded h = 512 HMM (scripts/commongen_gpu.sh) re-fitted to its samples
#                                                -> ctrlg/assets/hmm_smollm2_commongen_human_h512
#   7. the pipeline's default adapter: stage 5 on those captions capped at 20 per concept (the
#      stage-6 HMM guides it)                    -> ctrlg/assets/adapter_smollm2_commongen_human_balanced
# Each stage resumes where it stopped when run again (training state, sample chunks).
# Stages 1 and 5 make adapters that are not shipped (their LMs are what stages 3 and 6 sample);
# stage 6 starts from the h = 512 HMM `commongen-adapted-h512`, not shipped either: make it on a
# GPU first (docs/models.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000   # no page faults per training step
"$PY" -m experiments.adapt threads=1 output.copy_to=ctrlg/assets/adapter_smollm2_commongen
"$PY" -m experiments.adapt threads=2 form=supervised \
  output.copy_to=ctrlg/assets/adapter_smollm2_commongen_supervised
"$PY" -m experiments.distill --config-name distill_adapted \
  output.copy_to=ctrlg/assets/hmm_smollm2_commongen_adapted
"$PY" -m experiments.distill --config-name distill_supervised_head threads=2 \
  output.copy_to=ctrlg/assets/prior_head_smollm2_commongen_supervised
"$PY" -m experiments.adapt threads=2 data.select=sentence_case train.epochs=3 \
  output.dir=outputs/adapt/unsupervised_human output.copy_to=ctrlg/assets/adapter_smollm2_commongen_human
"$PY" -m experiments.distill --config-name distill_human threads=2 \
  output.copy_to=ctrlg/assets/hmm_smollm2_commongen_human_h512
"$PY" -m experiments.adapt threads=2 data.select=sentence_case_balanced train.epochs=3 \
  output.dir=outputs/adapt/unsupervised_human_balanced \
  output.copy_to=ctrlg/assets/adapter_smollm2_commongen_human_balanced
