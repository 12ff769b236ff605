#!/usr/bin/env bash
# The adapted CommonGen pipeline at paper scale, on one CUDA GPU (docs/gpu.md has the commands,
# figures and device times measured on one H100):
#   distill  N unconditional samples of the adapted LM drawn by the continuously batched sampler
#            (ctrlg.hmm.stream_sampling), LVD on the first LVD samples' hidden states, mini-batch EM
#            at h = H, the emission stored as its top 4,096 tokens per state in 8 bits
#            (configs/distill_adapted_gpu.yaml)
#   decode   the full CommonGen dev split with `ctrlg` at BEAMS beams (float32 LM), in SHARDS
#            processes sharing the GPU (item ranges aligned to the batches), merged into one run
# STAGES="distill decode" (default: both). Each stage resumes where it stopped (sample chunks;
# decode runs with resume=<folder>).
#   N=1048576 H=2048 SHARDS=8 scripts/commongen_gpu.sh
# (DEVICE=cpu N=64 H=8 HELDOUT=16 CHUNK=32 ROWS=16 LVD=32 ITEMS=2 BEAMS=2 SHARDS=2 BATCH=1
#  DISTILL_ARGS="em.num_chunks=2 em.schedule=[[1,2]] sampling.dtype=float32": a tiny run of the
#  same steps on a CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STAGES=${STAGES:-"distill decode"}
N=${N:-1048576}; H=${H:-2048}; SHARDS=${SHARDS:-8}; BEAMS=${BEAMS:-128}; ITEMS=${ITEMS:-993}; BATCH=${BATCH:-8}
DEVICE=${DEVICE:-cuda}; HELDOUT=${HELDOUT:-8192}; CHUNK=${CHUNK:-65536}; ROWS=${ROWS:-4096}
LVD=${LVD:-131072}; DISTILL_ARGS=${DISTILL_ARGS:-}; GUIDE_KERNEL=${GUIDE_KERNEL:-auto}
BEAM_SCORE=${BEAM_SCORE:-guided}  # the recorded 128-beam runs rank beams by the summed guided score
OUT_DIR=${OUT_DIR:-outputs/commongen_gpu}
SAMPLES=${SAMPLES:-$OUT_DIR/samples}; HMM_DIR=${HMM_DIR:-$OUT_DIR/hmm_h${H}_N${N}}
if [[ $STAGES == *distill* ]]; then
  # shellcheck disable=SC2086  # DISTILL_ARGS is a list of Hydra overrides
  "$PY" -m experiments.distill --config-name distill_adapted_gpu device="$DEVICE" hidden_size="$H" \
    sampling.num_sequences="$N" sampling.heldout_sequences="$HELDOUT" sampling.rows="$ROWS" \
    sampling.chunk_size="$CHUNK" lvd.sequences="$LVD" sampling.dir="$SAMPLES" output.dir="$HMM_DIR" \
    $DISTILL_ARGS
fi
if [[ $STAGES == *decode* ]]; then
  per=$(( (ITEMS + SHARDS * BATCH - 1) / (SHARDS * BATCH) * BATCH ))
  runs=()
  for ((i = 0; i < SHARDS; i++)); do
    offset=$((i * per)); limit=$per
    (( offset >= ITEMS )) && break
    (( offset + limit > ITEMS )) && limit=$((ITEMS - offset))
    run=$OUT_DIR/decode_h${H}_b${BEAMS}/ctrlg_${offset}; runs+=("$run")
    resume=null; [[ -f $run/generations.jsonl ]] && resume=$run
    OMP_NUM_THREADS=1 "$PY" -m experiments.commongen device="$DEVICE" "methods=[ctrlg]" \
      generation.num_beams="$BEAMS" model.dtype=float32 save_candidates=true generation.guide_kernel="$GUIDE_KERNEL" \
      generation.beam_score="$BEAM_SCORE" \
      hmm.path="$HMM_DIR/hmm" data.offset="$offset" data.limit="$limit" batch_size="$BATCH" \
      bootstrap.resamples=0 metrics.meteor=false resume="$resume" hydra.run.dir="$run" &
  done
  wait
  if (( ${#runs[@]} > 1 )); then
    "$PY" -m experiments.merge_runs "$OUT_DIR/ctrlg_h${H}_b${BEAMS}_merged" "${runs[@]}"
  fi
fi
