#!/usr/bin/env bash
# The adapted CommonGen pipeline at GPU scale, on one CUDA GPU (docs/experiments.md, "An HMM from
# 5x the samples, distilled on a GPU", has the figures and times measured on one H100):
#   1. N unconditional samples of the adapted LM (bfloat16, batches of 2048, chunks of 8192)
#   2. an h = H HMM distilled from them (LVD k-means and EM on the GPU) + the 39k training targets
#   3. the full CommonGen dev split decoded with `ctrlg` at 128 beams (float32 LM), in SHARDS
#      processes sharing the GPU (item ranges aligned to the batches), merged into one run folder
# Each stage resumes where it stopped (sample chunks; decode runs with resume=<folder>).
#   N=163840 H=512 SHARDS=8 scripts/commongen_gpu.sh
# (DEVICE=cpu N=16 H=8 HELDOUT=16 CHUNK=16 SAMPLE_BATCH=16 ITEMS=2 BEAMS=2 SHARDS=2 BATCH=1: a tiny
#  run of the same steps on a CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
N=${N:-163840}; H=${H:-512}; SHARDS=${SHARDS:-8}; BEAMS=${BEAMS:-128}; ITEMS=${ITEMS:-993}; BATCH=${BATCH:-8}
DEVICE=${DEVICE:-cuda}; HELDOUT=${HELDOUT:-1024}; CHUNK=${CHUNK:-8192}; SAMPLE_BATCH=${SAMPLE_BATCH:-2048}
OUT_DIR=${OUT_DIR:-outputs/commongen_gpu}
SAMPLES=$OUT_DIR/samples; HMM_DIR=$OUT_DIR/hmm_h${H}_N${N}
"$PY" -m experiments.distill --config-name distill_adapted device="$DEVICE" threads=4 hidden_size="$H" \
  sampling.num_sequences="$N" sampling.heldout_sequences="$HELDOUT" sampling.batch_size="$SAMPLE_BATCH" \
  sampling.chunk_size="$CHUNK" sampling.dir="$SAMPLES" em.batch_size=4096 output.dir="$HMM_DIR"
per=$(( (ITEMS + SHARDS * BATCH - 1) / (SHARDS * BATCH) * BATCH ))
runs=()
for ((i = 0; i < SHARDS; i++)); do
  offset=$((i * per)); limit=$per
  (( offset >= ITEMS )) && break
  (( offset + limit > ITEMS )) && limit=$((ITEMS - offset))
  run=$OUT_DIR/decode/ctrlg_${offset}; runs+=("$run")
  resume=null; [[ -f $run/generations.jsonl ]] && resume=$run
  OMP_NUM_THREADS=1 "$PY" -m experiments.commongen device="$DEVICE" "methods=[ctrlg]" \
    generation.num_beams="$BEAMS" model.dtype=float32 save_candidates=true \
    hmm.path="$HMM_DIR/hmm" data.offset="$offset" data.limit="$limit" batch_size="$BATCH" \
    bootstrap.resamples=0 metrics.meteor=false resume="$resume" hydra.run.dir="$run" &
done
wait
if (( ${#runs[@]} > 1 )); then "$PY" -m experiments.merge_runs "$OUT_DIR/ctrlg_merged" "${runs[@]}"; fi
