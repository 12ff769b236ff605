#!/usr/bin/env bash
# The search options against the default `ctrlg` beam search, on CommonGen dev
# items [OFFSET, OFFSET + ITEMS) with the adapted pipeline at BEAMS beams (docs/experiments.md,
# "Search options"; the runs: docs/notes/commongen_results.md): one run each for
#   base       logical + ctrlg (the default: guided beam scores)
#   lookahead  ctrlg_lookahead  generation.beam_score=lookahead
#   sampleK    ctrlg_sampleK    generation.num_beams=1 generation.num_samples=K (K guided samples + rerank)
#   diverse    ctrlg_diverseG   generation.sibling_penalty=G (diverse beams, Li et al. 2016)
# then merged into one folder and scored with paired-bootstrap intervals of each option − ctrlg.
# Each run resumes where it stopped. PARALLEL=1 runs the four decodes as concurrent processes
# (one GPU, or one core each).
#   OFFSET=500 ITEMS=493 DEVICE=cuda PARALLEL=1 scripts/commongen_search_options.sh
# (ITEMS=5 on a CPU: a smoke run of the same steps)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OFFSET=${OFFSET:-500}; ITEMS=${ITEMS:-493}; DEVICE=${DEVICE:-cpu}; BEAMS=${BEAMS:-8}
K=${K:-32}; G=${G:-1.0}; PARALLEL=${PARALLEL:-0}
OUT_DIR=${OUT_DIR:-outputs/commongen_search/dev${OFFSET}_${ITEMS}_b${BEAMS}}
GNAME=${G//./}
common=(pipeline=adapted device="$DEVICE" data.offset="$OFFSET" data.limit="$ITEMS"
        generation.num_beams="$BEAMS")
specs=("+method_specs.ctrlg_lookahead={guide: ctrlg}" "+method_specs.ctrlg_sample${K}={guide: ctrlg}"
       "+method_specs.ctrlg_diverse${GNAME}={guide: ctrlg}")
decode() {   # name, then overrides
  local run=$OUT_DIR/$1; shift
  local resume=null; [[ -f $run/generations.jsonl ]] && resume=$run
  OMP_NUM_THREADS=1 "$PY" -m experiments.commongen "${common[@]}" "$@" metrics.meteor=false \
    bootstrap.resamples=0 resume="$resume" hydra.run.dir="$run"
}
jobs_=(
  "base|methods=[logical,ctrlg]"
  "lookahead|methods=[ctrlg_lookahead]|${specs[0]}|generation.beam_score=lookahead"
  "sample${K}|methods=[ctrlg_sample${K}]|${specs[1]}|generation.num_beams=1|generation.num_samples=${K}"
  "diverse${GNAME}|methods=[ctrlg_diverse${GNAME}]|${specs[2]}|generation.sibling_penalty=${G}"
)
for job in "${jobs_[@]}"; do
  IFS='|' read -r -a args <<< "$job"
  if [[ $PARALLEL == 1 ]]; then decode "${args[@]}" & else decode "${args[@]}"; fi
done
wait
rm -rf "$OUT_DIR/merged"
"$PY" -m experiments.merge_runs "$OUT_DIR/merged" "$OUT_DIR/base" "$OUT_DIR/lookahead" \
  "$OUT_DIR/sample${K}" "$OUT_DIR/diverse${GNAME}" --allow-differing generation.beam_score \
  generation.num_beams generation.num_samples generation.sibling_penalty
"$PY" -m experiments.commongen "${common[@]}" \
  "methods=[logical,ctrlg,ctrlg_lookahead,ctrlg_sample${K},ctrlg_diverse${GNAME}]" "${specs[@]}" \
  bootstrap.resamples=1000 bootstrap.baseline=ctrlg resume="$OUT_DIR/merged" \
  hydra.run.dir="$OUT_DIR/scored"
