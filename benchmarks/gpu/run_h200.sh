#!/usr/bin/env bash
# Real-scale evidence on one H200 (or any CUDA GPU), offline. Run from the repo root:
#
#   bash benchmarks/gpu/run_h200.sh prepare   # on a machine with network: fills .device-carry/
#   bash benchmarks/gpu/run_h200.sh build     # on the GPU machine: CUDA runtime (background-safe)
#   bash benchmarks/gpu/run_h200.sh synth     # Qwen3.6-35B-A3B-shaped BF16 (40 layers + blk.40) in /dev/shm
#   bash benchmarks/gpu/run_h200.sh quantize  # ggufmtp quantize (Hi-Fi), timed; QUANT_CLI=1: also llama-quantize
#   bash benchmarks/gpu/run_h200.sh qvc       # issue #22: ggufmtp quantize WITH receipt vs llama-quantize, $RUNS (3)
#                                             # interleaved runs each, stage breakdown -> qvc.json; CPU-only runtime
#                                             # STAGES=qvc BUILD_STAGE=cpu-build RUNS=3 bash benchmarks/gpu/run_h200.sh all
#                                             # skips the CUDA build: ~3 min build and synth, 6 x ~4 min; the tenth
#                                             # run held its machine 27 min (a machine goes back after 30)
#   bash benchmarks/gpu/run_h200.sh imatrix   # #18/#34: llama-imatrix alone; compute vs compute --mtp, interleaved
#                                             # (IBASE_SRC=old/mtp_imatrix.cpp: + --mtp with that collector)
#   bash benchmarks/gpu/run_h200.sh qgap      # issue #34: where in-process quantization loses time (benchmarks/
#                                             # quantize_gap.py: cli, bare ctypes call, + log callback, + worker
#                                             # thread, + input hash, + output hash, ggufmtp), $QRUNS interleaved
#                                             # runs on a $QLAYERS-layer Qwen3.6-shaped model
#   bash benchmarks/gpu/run_h200.sh ladder    # issue #33: a 6-rung ladder of a $LLAYERS-layer Qwen3.6-shaped model,
#                                             # in sequence, then on a 2-worker local Dask cluster (one GPU each);
#                                             # wall times and each GPU's utilisation (nvidia-smi, 1 s) -> ladder-*.
#                                             # LADDER_STAGES="lsynth qgap ladder": the CUDA build and the two models
#   bash benchmarks/gpu/run_h200.sh rehearsal # issue #41 item 7: the release rehearsal: a 4-variant ladder of a $RLAYERS
#                                             # (10)-layer Qwen3.6-shaped model + a Q8_0 MTP sidecar, in sequence (GPU 0,
#                                             # every core), then on a $RGPUS (4)-worker Dask cluster with the sidecar
#                                             # beside it; rehearsal-*.json carry every task's and stage's time and
#                                             # benchmarks/ladder_bound.py compares the concurrent wall with the ideal
#                                             # overlap -> rehearsal-bound.txt. On nvidia-h100-x4:
#                                             # BUILD_STAGE=build SYNTH_STAGE=rsynth STAGES=rehearsal \
#                                             #   setsid nohup bash benchmarks/gpu/run_h200.sh all &  (then `wait 560`)
#                                             # CPU smoke run: RSHAPE=tiny RLAYERS=2 RGPUS=2 GGUFMTP_RUNTIME_VARIANT=cpu
#   bash benchmarks/gpu/run_h200.sh search    # issue #43's GPU half: the recipe search of the gpu-small trained model at
#                                             # hifi-q4_k_m-mtp's and iq2_xxs-mtp's size, proved on held-out prompts
#                                             # (BUILD_STAGE=study-build SYNTH_STAGE=study-train STAGES=search ... all)
#   bash benchmarks/gpu/run_h200.sh headsweep # issue #19: head-precision sweep (margin head, 10 trunk layers)
#                                             # SYNTH_STAGE=hs-synth STAGES="headsweep evaltime" BUILD_STAGE=build
#                                             #   bash benchmarks/gpu/run_h200.sh all: the sweep's model only
#   bash benchmarks/gpu/run_h200.sh evaltime  # issue #19: ggufmtp eval vs llama-perplexity alone (after headsweep,
#                                             # or alone: SYNTH_STAGE=hs-synth STAGES=evaltime ... all)
#   bash benchmarks/gpu/run_h200.sh tune      # ggufmtp tune: server settings by successive halving
#   bash benchmarks/gpu/run_h200.sh verify-tuned  # ggufmtp verify --tuned-from tune.json: tuned MTP vs the equally
#                                             # configured vanilla (fair) and vs a default vanilla (third arm)
#   bash benchmarks/gpu/run_h200.sh fair      # k=4, -bs on both arms: fair speedup and vs default vanilla (issue #17)
#   bash benchmarks/gpu/run_h200.sh matrix    # KV cache f16/q8_0/q4_0 x depth 0/8192/32768, both arms alike (#17)
#   bash benchmarks/gpu/run_h200.sh configs   # the same for each file in $CONFIGS (default benchmarks/gpu/configs/*.json)
#                                             # LIMIT=24 SEEDS=42 CONFIGS="benchmarks/gpu/screen/*.json": a quick screen
#   bash benchmarks/gpu/run_h200.sh profiles  # serving workloads A-D, MTP (tuned) vs vanilla, both with $PROFILE_ARGS
#   bash benchmarks/gpu/run_h200.sh verify    # ggufmtp verify with default server settings (k=$K, default 3)
#   bash benchmarks/gpu/run_h200.sh curve     # speedup vs synthetic acceptance of this GPU
#   bash benchmarks/gpu/run_h200.sh tune-trained  # tune on the trained model (after numerics): explained differences kept
#                                             # (SYNTH_STAGE=study-train STAGES="numerics tune-trained" ... all)
#   bash benchmarks/gpu/run_h200.sh gopt-determinism  # vanilla's replies with GGML_CUDA_GRAPH_OPT off/on, 3x each
#   bash benchmarks/gpu/run_h200.sh numerics  # verify's numerics analysis on the trained model, GPU (SYNTH_STAGE=synth-and-train
#                                             # STAGES="numerics imatrix" ... all: with #34's real-scale imatrix cost)
#   bash benchmarks/gpu/run_h200.sh study     # issue #29: train the GPU model (study-train, if not done), then
#                                             # benchmarks/learned_head_study.py on it, sized to the budget; the
#                                             # whole study in one command (the build niced, training meanwhile):
#                                             # BUILD_STAGE=study-build SYNTH_STAGE=study-train STAGES=study \
#                                             #   setsid nohup bash benchmarks/gpu/run_h200.sh all &  (then `wait 560`)
#                                             # results in $RES/study/ (train.json, train-log.jsonl, reproduce.json,
#                                             # study.md, study.json, arms/, raw/); the models stay in $WORK/study
#   bash benchmarks/gpu/run_h200.sh dense     # issue #52 item 3: the dense Qwen3.6-27B shape (64 layers + blk.64, head
#                                             # designed to the published 67.5% at k=4), quantized $DRECIPE (iq4_xs-mtp),
#                                             # then $DENSE_STAGES (fair tune verify-tuned) on it -> $RES/dense/:
#                                             # SYNTH_STAGE=dsynth STAGES=dense setsid nohup bash ... all &
#   bash benchmarks/gpu/run_h200.sh headtypes # issue #52 item 2: the speed of each head type at equal acceptance
#                                             # ($QSOURCE's head re-typed, on $QMODEL's trunk) -> headtypes.{json,md}
#   bash benchmarks/gpu/run_h200.sh joint     # issue #52 item 1: tune-joint (heads x k x p-min x GPU options),
#                                             # reading headtypes.json -> joint.json, joint-recipe.toml; then
#                                             # joint-verify (quantize with the recipe, verify --tuned-from);
#                                             # the dense shape: DENSE_STAGES="headtypes joint" ... dense
#   bash benchmarks/gpu/run_h200.sh draftcost # issue #52: a step's ms by part (draft, accept, verify) and graph use at
#                                             # joint.json's configuration, windows $DC_K (benchmarks/draft_cost.py) -> draftcost.{json,md}
#   bash benchmarks/gpu/run_h200.sh both      # nvidia-h200-x2: the 35B-A3B chain on GPU 0 and the dense chain on GPU 1
#                                             # at once (headtypes joint draftcost joint-verify), cputests beside
#   bash benchmarks/gpu/run_h200.sh memplan   # issue #49 item 6: `run` with an 80 GB ballast, `verify --n-cpu-moe`
#                                             # with a 24 GB one (STAGES=memplan ... all)
#   bash benchmarks/gpu/run_h200.sh cputests  # the numerical tests on this machine's CPU ($TEST_CORES, default 0-5),
#                                             # beside the CUDA build: setsid nohup bash ... cputests &
#   bash benchmarks/gpu/run_h200.sh all       # build+synth in parallel, then $STAGES (default: all of the above)
#   bash benchmarks/gpu/run_h200.sh detach    # after `all`, on the same warm machine: $STAGES, detached
#   bash benchmarks/gpu/run_h200.sh wait N    # wait up to N s for `all` to finish, then collect
#   bash benchmarks/gpu/run_h200.sh collect   # copy results to $OUT (the device tool's return folder)
#
# With the device tool: start `all` detached (`setsid nohup bash benchmarks/gpu/run_h200.sh all &`)
# in the first call, then call `wait 560` back to back (a machine idle for 30 s is given back); each
# `wait` returns the results so far, so a machine taken back early still leaves its figures. For
# more stages on the still-warm machine, `STAGES="..." bash benchmarks/gpu/run_h200.sh detach`, then
# `wait` again: a job a call starts with a plain `&` is stopped when that call ends.
#
# Everything the GPU machine needs travels in .device-carry/ (git-ignored): the llama.cpp tree of
# the pinned llama-cpp-python sdist (trimmed of models/docs), llama-cpp-python's pure-Python
# package (it loads the CUDA libllama through LLAMA_CPP_LIB_PATH) and wheels for gguf/jsonschema.
# Results land in $OUT (or ./gpu-results) as logs and JSON; benchmarks/README.md records them.
set -euo pipefail
STAGE=${1:?stage}
CARRY=${CARRY:-.device-carry}
RES=${RES:-/tmp/gpu-results}   # survives between device calls; `collect` copies it to $OUT
WORK=${WORK:-/dev/shm/ggufmtp}
LAYERS=${LAYERS:-40}
# wrong-successor fraction: 71 of the 544 text tokens corrupted, so the head's exact acceptance on
# chat-v1 (128 tokens) at k=3 is 74.96%, the goal's 75%. `ggufmtp synth --target-acceptance 0.75`
# printed it on a CPU machine (it needs a built llama-server to tokenize the prompts, and here synth
# runs while the CUDA build is still going). Runs 1-4 used 0.136: 75.2% by the iid formula, 74.0%
# measured on the suite.
WRONG=${WRONG:-0.130515}
# the artifact (and its recipe) that verify, fair, matrix, tune, verify-tuned, curve and profiles measure:
# the 35B-A3B Hi-Fi quant of `quantize` unless a stage that made another (dense) points them at it
QMODEL=${QMODEL:-$WORK/hifi.gguf}
QRECIPE=${QRECIPE:-hifi-q4_k_m-mtp}
# the BF16 $QMODEL was quantized from (its receipt names it): headtypes and joint re-type its head
QSOURCE=${QSOURCE:-$WORK/qwen36-shape-bf16.gguf}
# the dense Qwen3.6-27B-shaped model of `dsynth` / `dense` (#52 item 3), in $DWORK (`both` puts it on disk:
# the two BF16s, 72 + 57 GB, need not share the tmpfs)
DWORK=${DWORK:-$WORK}
DBF16=$DWORK/qwen36-27b-shape-bf16.gguf
DRECIPE=${DRECIPE:-iq4_xs-mtp}   # the published measurement's quantization: IQ4_XS, the head's eh_proj at Q8_0
mkdir -p "$RES" "$WORK" "$DWORK"

# GGUFMTP_SRC: a folder holding the ggufmtp package to run instead of the working tree's (e.g. a
# committed snapshot, `git archive HEAD ggufmtp recipes | tar -x -C .device-carry/src`, carried with the
# call); SITE: where the carried wheels go (a local smoke run points it at a folder of its own)
SITE=${SITE:-/tmp/site}
env_setup() {
  if [ ! -d "$SITE/gguf" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$CARRY"/wheels/*.whl
  fi
  export PYTHONPATH=$SITE:${GGUFMTP_SRC:-$PWD}:$PWD:$PWD/$CARRY/pylib
  if [ -n "${GGUFMTP_SRC:-}" ]; then export PYTHONSAFEPATH=1; fi  # `python3 -m` then puts no $PWD before it
  export GGUFMTP_CACHE=${GGUFMTP_CACHE:-/tmp/ggufmtp-cache}
  export GGUFMTP_LLAMA_CPP_SDIST=$PWD/$CARRY/llama-src.tar.gz
  export GGUFMTP_RUNTIME_VARIANT=${GGUFMTP_RUNTIME_VARIANT:-cuda-sm90}  # cpu: a local smoke run of a stage
  export PYTHONUNBUFFERED=1
}

# verify: the MTP arm with the configuration in $1; the vanilla arm gets its non-speculative settings
# (-bs, threads) and a third, default vanilla arm is measured in the same rotation -> verify-$2.*
# (the full suite unless $LIMIT; seeds $SEEDS)
verify_tuned() {
  python3 -m ggufmtp verify "$QMODEL" --gpu-layers 999 --tuned-from "$1" ${LIMIT:+--limit "$LIMIT"} \
    --seeds "${SEEDS:-42,1337,2024}" --max-tokens "${MAXTOK:-128}" --recipe "$QRECIPE" \
    --out "$RES/verify-$2.json" > "$RES/verify-$2.txt" 2> "$RES/verify-$2.log" || true
}

# a fresh progress file, so `wait` does not take an earlier run's "done" for this one's
new_progress() {
  if [ -f "$RES/progress.txt" ]; then cat "$RES/progress.txt" >> "$RES/progress-earlier.txt"; rm "$RES/progress.txt"; fi
}

run_stages() {
  for s in "$@"; do
    date +"%T start $s" >> "$RES/progress.txt"
    bash "$0" "$s" > "$RES/stage-$s.out" 2>&1 || date +"%T $s FAILED" >> "$RES/progress.txt"
  done
  [ "${NO_DONE:-0}" = 1 ] || date +"%T done" >> "$RES/progress.txt"
}

case "$STAGE" in
  prepare)
    mkdir -p "$CARRY/wheels" "$CARRY/pylib"
    sdist=$(python3 tools/build_runtime.py --print-sdist)
    tmp=$(mktemp -d); tar xzf "$sdist" -C "$tmp"
    d=$(ls "$tmp"); v=$d/vendor/llama.cpp
    tar czf "$CARRY/llama-src.tar.gz" -C "$tmp" --exclude="$v/models" --exclude="$v/docs" \
      --exclude="$v/examples" --exclude="$v/tools/server/webui" --exclude="$v/media" "$v"
    cp -r "$tmp/$d/llama_cpp" "$CARRY/pylib/"
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$CARRY/wheels" gguf==0.19.0 jsonschema referencing jsonschema-specifications rpds-py diskcache \
      dask==2026.8.0 distributed==2026.8.0 cloudpickle partd toolz locket msgpack sortedcontainers tblib \
      tornado zict psutil
    rm -rf "$tmp"; du -sh "$CARRY" ;;
  build)
    env_setup
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/gpu.txt"
    /usr/bin/time -v python3 -m ggufmtp runtime build --cuda --cuda-arch 90 -j "$(nproc)" --json \
      > "$RES/build.json" 2> "$RES/build.log"
    python3 -m ggufmtp doctor --json > "$RES/doctor.json" || true ;;
  synth)
    env_setup
    [ -f "$WORK/qwen36-shape-bf16.gguf" ] && exit 0
    /usr/bin/time -v python3 -m ggufmtp synth "$WORK/qwen36-shape-bf16.gguf" --shape "${SHAPE:-qwen3.6-35b-a3b}" \
      --layers "$LAYERS" --wrong-successor-fraction "$WRONG" --json > "$RES/synth.json" 2> "$RES/synth.log" ;;
  quantize)
    env_setup
    M=$WORK/qwen36-shape-bf16.gguf
    T="/usr/bin/time -f %e_s_%M_KiB -o"
    python3 -m ggufmtp plan "$M" --recipe hifi-q4_k_m-mtp --json > "$RES/plan.json" || true
    $T "$RES/time-ggufmtp.txt" python3 -m ggufmtp quantize "$M" --recipe hifi-q4_k_m-mtp -o "$WORK/hifi.gguf" \
      -t "$(nproc)" --no-progress --json > "$RES/quantize.json"
    [ "${QUANT_CLI:-1}" = 1 ] || { echo "ggufmtp $(cat "$RES/time-ggufmtp.txt")" | tee "$RES/quantize_times.txt"; exit 0; }
    cmd=$(python3 -m ggufmtp plan "$M" --recipe hifi-q4_k_m-mtp --emit llama-quantize --out "$WORK/cli.gguf")
    Q=$(python3 -m ggufmtp runtime path)/llama-quantize
    eval "$T $RES/time-cli.txt ${cmd/llama-quantize/$Q} $(nproc)" > "$RES/cli_quantize.log" 2>&1
    { echo "ggufmtp $(cat "$RES/time-ggufmtp.txt")"; echo "llama-quantize $(cat "$RES/time-cli.txt")";
      cmp -s "$WORK/hifi.gguf" "$WORK/cli.gguf" && echo "byte_identical yes" || echo "byte_identical NO"; } \
      | tee "$RES/quantize_times.txt"
    rm -f "$WORK/cli.gguf" ;;
  cpu-build)
    env_setup
    GGUFMTP_RUNTIME_VARIANT=cpu python3 -m ggufmtp runtime build -j "$(nproc)" --json \
      > "$RES/qvc-build.json" 2> "$RES/qvc-build.log" ;;
  qvc)
    # quantization is CPU work: a CPU-only runtime (no nvcc, faster to build) serves both arms, the
    # in-process libllama and the llama-quantize binary, from one build. Outputs go to $WORK (the
    # input's tmpfs, as in the issue's measurement: fsync costs nothing there) one at a time.
    env_setup
    export GGUFMTP_RUNTIME_VARIANT=cpu
    [ -f "$RES/qvc-build.json" ] || bash "$0" cpu-build
    python3 benchmarks/quantize_vs_cli.py --model "$WORK/qwen36-shape-bf16.gguf" --runs "${RUNS:-3}" \
      --threads "$(nproc)" --dir "$WORK" --no-cat --json "$RES/qvc.json" 2>&1 | tee "$RES/qvc.txt" ;;
  imatrix)
    # issue #18: `ggufmtp imatrix compute` against llama-imatrix alone on the same corpus, chunks and
    # context, and the extra cost of --mtp (the MTP head's statistics); all on the GPU, one run each
    env_setup
    M=$WORK/qwen36-shape-bf16.gguf
    C=$(python3 -c "from ggufmtp.imatrix.corpus import resolve_corpus as r; print(r('builtin:calib-v1').path)")
    T="/usr/bin/time -f %e_s_%M_KiB -o"
    Q=$(python3 -m ggufmtp runtime path)
    $T "$RES/imatrix-time-cli.txt" "$Q/llama-imatrix" -m "$M" -f "$C" -o "$WORK/im-cli.gguf" -c 512 \
      --chunks "${ICHUNKS:-16}" -ngl 999 --no-repack > "$RES/imatrix-cli.log" 2>&1 || true
    # issue #34: `compute --mtp` (one pass since #34) against `compute`, interleaved, $IRUNS pairs;
    # IBASE_SRC=FILE (an earlier mtp_imatrix.cpp): a third arm, --mtp with that collector, in the rotation
    base=()
    if [ -n "${IBASE_SRC:-}" ]; then
      python3 -c "from ggufmtp.runtime.build import find_binary as f; f('ggufmtp-mtp-imatrix')"  # today's, compiled
      rm -rf "$GGUFMTP_CACHE-base"; cp -a "$GGUFMTP_CACHE" "$GGUFMTP_CACHE-base"
      GGUFMTP_CACHE=$GGUFMTP_CACHE-base python3 - "$IBASE_SRC" <<'PY'
import subprocess, sys
from ggufmtp.runtime import build as b
name = b.MTP_IMATRIX_TOOL
info = b.installed_runtime()  # the copy: its runtime.json records today's source, so nothing recompiles it
argv = b.native_compile_argv(name, info.bin_dir, b.source_tree(), info.binary(name))
argv[argv.index(str(b.NATIVE_DIR / b.NATIVE_TOOLS[name]))] = sys.argv[1]
subprocess.run(argv, check=True)
PY
      base=(--baseline-cache "$GGUFMTP_CACHE-base")
    fi
    python3 benchmarks/imatrix_mtp_cost.py --model "$M" --chunks "${ICHUNKS:-16}" --gpu-layers 999 \
      --runs "${IRUNS:-3}" "${base[@]}" --json "$RES/imatrix_mtp_cost.json" > "$RES/imatrix_mtp_cost.txt" 2>&1 || true
    $T "$RES/imatrix-time-mtp.txt" python3 -m ggufmtp imatrix compute "$M" --corpus builtin:calib-v1 \
      -o "$WORK/im-mtp.gguf" --chunks "${ICHUNKS:-16}" -ngl 999 --mtp --no-progress --json \
      > "$RES/imatrix-mtp.json" 2> "$RES/imatrix-mtp.log" || true
    python3 -m ggufmtp imatrix info "$WORK/im-mtp.gguf" --model "$M" > "$RES/imatrix-mtp-info.txt" 2>&1 || true
    for k in cli mtp; do echo "$k $(cat "$RES/imatrix-time-$k.txt")"; done | tee "$RES/imatrix_times.txt"
    cat "$RES/imatrix_mtp_cost.txt" ;;
  headsweep)
    # issue #19: the head-precision sweep on Qwen3.6-35B-A3B's per-layer shapes with $HS_LAYERS trunk
    # layers (10 by default, so five quantizations fit one machine's lease) and a head whose drafts
    # win by $HEAD_MARGIN logits (it reacts to quantization); IQ4_XS uses the MTP imatrix
    env_setup
    H=$WORK/margin-bf16.gguf
    [ -f "$H" ] || bash "$0" hs-synth
    python3 -m ggufmtp imatrix compute "$H" --corpus builtin:calib-v1 -o "$WORK/hs-imatrix.gguf" \
      --chunks 8 -ngl 999 --mtp --no-progress --json > "$RES/hs-imatrix.json" 2> "$RES/hs-imatrix.log" || true
    python3 -m ggufmtp head-sweep "$H" -r hifi-q4_k_m-mtp --types "${HS_TYPES:-Q8_0,Q6_K,Q4_K,IQ4_XS}" \
      --imatrix "$WORK/hs-imatrix.gguf" -o "$WORK/hs" -ngl 999 -t "$(nproc)" --limit "${HS_LIMIT:-20}" \
      --seeds "${HS_SEEDS:-42,1337}" --max-tokens "${MAXTOK:-128}" --write-recipe "$RES/hs-best.toml" --json \
      > "$RES/headsweep.json" 2> "$RES/headsweep.log" || true
    tail -c 2000 "$RES/headsweep.json" ;;
  hs-synth)
    # the head sweep's model; `SYNTH_STAGE=hs-synth ... all` makes it while the build runs (and skips
    # the 72 GB model, which the sweep does not use and /dev/shm need not hold)
    env_setup
    /usr/bin/time -v python3 -m ggufmtp synth "$WORK/margin-bf16.gguf" --shape qwen3.6-35b-a3b \
      --layers "${HS_LAYERS:-10}" --head-margin "${HEAD_MARGIN:-0.08}" --json > "$RES/hs-synth.json" 2> "$RES/hs-synth.log" ;;
  evaltime)
    # issue #19: `ggufmtp eval` (fresh cache) against llama-perplexity alone (base pass + KLD pass)
    env_setup
    H=$WORK/margin-bf16.gguf
    q=$(ls "$WORK"/hs/*-head-q4_k.gguf 2>/dev/null | head -1 || true)  # none without a head sweep (pipefail)
    [ -f "$H" ] || bash "$0" hs-synth
    if [ -z "$q" ]; then  # without a head sweep before it: one Hi-Fi quant (with its receipt, as a user's would be)
      q=$WORK/ev-hifi.gguf
      [ -f "$q" ] || python3 -m ggufmtp quantize "$H" -r hifi-q4_k_m-mtp -o "$q" -t "$(nproc)" --no-progress --json \
        > "$RES/ev-quantize.json" 2> "$RES/ev-quantize.log"
    fi
    C=$(python3 -c "from ggufmtp.imatrix.corpus import resolve_corpus as r; print(r('builtin:calib-v1').path)")
    P=$(python3 -m ggufmtp runtime path)/llama-perplexity
    T="/usr/bin/time -f %e_s_%M_KiB -o"
    for i in $(seq "${EVAL_RUNS:-3}"); do
      $T "$RES/eval-time-base-$i.txt" "$P" -m "$H" -f "$C" -c 512 --chunks 8 -ngl 999 --no-repack \
        --kl-divergence-base "$WORK/kl.bin" > "$RES/eval-cli-base.log" 2>&1 || true
      $T "$RES/eval-time-kld-$i.txt" "$P" -m "$q" -f "$C" -c 512 --chunks 8 -ngl 999 --no-repack \
        --kl-divergence-base "$WORK/kl.bin" --kl-divergence > "$RES/eval-cli-kld.log" 2>&1 || true
      rm -f "$GGUFMTP_CACHE"/kld/*.logits  # a fresh base pass; the token-count memo stays
      $T "$RES/eval-time-ours-$i.txt" python3 -m ggufmtp eval "$H" "$q" --corpus builtin:calib-v1 --chunks 8 \
        -ngl 999 --json > "$RES/eval-ours-$i.json" 2> "$RES/eval-ours.log" || true
    done
    for f in "$RES"/eval-time-*.txt; do echo "$(basename "$f" .txt) $(cat "$f")"; done | tee "$RES/eval_times.txt" ;;
  verify-tuned)
    env_setup
    verify_tuned "$RES/tune.json" tuned
    tail -8 "$RES/verify-tuned.txt" ;;
  configs)
    env_setup
    for c in ${CONFIGS:-benchmarks/gpu/configs/*.json}; do
      n=$(basename "$c" .json)
      date +"%T   config $n" >> "$RES/progress.txt"
      verify_tuned "$c" "$n"
      grep -E "^overall|^identical" "$RES/verify-$n.txt" || true
    done ;;
  verify)
    env_setup
    python3 -m ggufmtp verify "$QMODEL" --gpu-layers 999 --draft-n-max "${K:-3}" \
      --seeds 42,1337,2024 --max-tokens "${MAXTOK:-128}" --recipe "$QRECIPE" --json \
      --out "$RES/verify.json" > "$RES/verify.txt" 2> "$RES/verify.log" || true
    tail -8 "$RES/verify.txt" ;;
  fair)
    # the issue's measurement, fair: 20 prompts x 2 seeds x 256 tokens, k=4, GPU sampling on both
    # arms (-bs), the drafter's backend sampling on (llama-server's default, named to be explicit);
    # verify adds the default-configured vanilla arm in the same rotation
    env_setup
    python3 -m ggufmtp verify "$QMODEL" --gpu-layers 999 --draft-n-max 4 --server-arg=-bs \
      --mtp-server-arg=--spec-draft-backend-sampling --limit "${LIMIT:-20}" --seeds "${SEEDS:-42,1337}" \
      --max-tokens "${MAXTOK:-256}" --out "$RES/verify-fair.json" > "$RES/verify-fair.txt" 2> "$RES/verify-fair.log" || true
    tail -30 "$RES/verify-fair.txt" ;;
  matrix)
    # KV cache type x context depth; both arms configured alike (llama-server defaults plus the
    # cache types and the flash attention a quantized V cache needs), so no third arm: each cell's
    # speedup is the fair one. 32768 deep needs 32768 + 269 (longest prompt) + 128 tokens of context.
    env_setup
    python3 -m ggufmtp verify "$QMODEL" --gpu-layers 999 -c 34816 --draft-n-max 4 \
      --limit "${MLIMIT:-8}" --seeds "${MSEEDS:-42}" --max-tokens "${MMAXTOK:-128}" \
      --matrix "${MATRIX:-kv=f16,q8_0,q4_0 depth=0,8192,32768}" \
      --out "$RES/matrix.json" > "$RES/matrix.txt" 2> "$RES/matrix.log" || true
    tail -30 "$RES/matrix.txt" ;;
  tune)
    env_setup
    python3 -m ggufmtp tune "$QMODEL" --gpu-layers 999 --seeds 42 --max-tokens "${MAXTOK:-128}" --budget "${BUDGET:-240}" \
      --out "$RES/tune.json" > "$RES/tune.txt" 2> "$RES/tune.log" || true
    tail -25 "$RES/tune.txt" ;;
  curve)
    env_setup
    python3 -m ggufmtp curve "$QMODEL" --gpu-layers 999 --max-tokens "${MAXTOK:-128}" \
      --out "$RES/curve.json" > "$RES/curve.txt" 2> "$RES/curve.log" || true
    tail -15 "$RES/curve.txt" ;;
  profiles)
    env_setup
    args=()
    [ -f "$RES/tune.json" ] && args=(--tuned-from "$RES/tune.json")
    read -r -a pargs <<< "${PROFILE_ARGS---server-arg=-bs}"
    python3 -m ggufmtp profiles "$QMODEL" --gpu-layers 999 "${args[@]}" "${pargs[@]}" \
      --out "$RES/profiles.json" > "$RES/profiles.txt" 2> "$RES/profiles.log" || true
    tail -25 "$RES/profiles.txt" ;;
  headtypes)
    # #52 item 2: the speed of a head type at equal acceptance. $QSOURCE's head re-typed to each of
    # $HT_TYPES (cut once, quantized with $QRECIPE's [mtp] roles at the type), each drafting on
    # $QMODEL's trunk (-md) in one verify against $QSOURCE at k=$HT_K: head finding, lossless, fair
    # speedup (-ngl 999, no -bs: llama-server's defaults on both arms) -> headtypes.{json,md,txt}.
    # The first two rows are $QMODEL's own head built in and the same head as a sidecar (-md, as every
    # type is served): their difference is what -md costs, so the types compare like with like.
    # Sized for ~8 min on an H200 (35B-A3B hifi; estimates from the stages' earlier timings, not
    # measured as a whole): hashing the 72 GB source (cached after the first stage that hashed it) and
    # cutting its head and the artifact's (~3.7 GB each) ~1.5 min, five ~3.7 GB quantizations ~1.5 min,
    # then seven verifies (own, own-md, 5 types) of 6 prompts x seed 42 x 128 tokens per mode: two
    # server starts (~15 s each) and 6 pairs at ~1 s (vanilla ~215 tok/s, MTP ~330) per mode, the
    # source head's arm once (cached) -- ~45 s each. The dense 27B (`dense` with DENSE_STAGES=
    # "headtypes joint"): pairs ~2.3 s (89/157 tok/s), so four types (DHT_TYPES) keep it near 8 min.
    env_setup
    python3 benchmarks/head_type_speed.py "$QMODEL" --source "$QSOURCE" --recipe "$QRECIPE" \
      --types "${HT_TYPES:-F16,BF16,Q8_0,Q6_K,Q4_K}" --k "${HT_K:-4}" --limit "${HT_LIMIT:-6}" --seeds 42 \
      --max-tokens "${MAXTOK:-128}" --gpu-layers 999 --json "$RES/headtypes.json" --md "$RES/headtypes.md" \
      > "$RES/headtypes.txt" 2> "$RES/headtypes.log" || true
    cat "$RES/headtypes.txt" ;;
  joint)
    # #52 item 1: tune-joint on $QMODEL, the heads stage read from headtypes.json (run `headtypes`
    # first, else it is measured here too: ~8 min more), the two fastest kept heads x k 3-6 x p-min
    # 0/0.75 x -bs/drafter sampling/CUDA graph opt. (tune's GPU dimensions) x flash attention auto/off
    # x KV f16/q8_0 x batch default/2048:2048 (--gpu-options), successive halving in $JOINT_BUDGET
    # evaluations (MTP requests of 128 tokens, seed 42) -> joint.{json,txt}, joint-recipe.toml, and
    # verify --tuned-from joint.json is then `verify-tuned`'s job on an artifact quantized with the recipe.
    # Sized for ~8 min on an H200: tune's budget 160 took 449-456 s there (~2.8 s per evaluation, server
    # starts included), so 96 evaluations ~270 s, plus a vanilla server per option setting (~15 s each,
    # ~7 in the first rung) and the default vanilla's replies once per unit (~16 s) ~ 6.5-7 min. The
    # dense 27B: DJOINT_BUDGET (64; ~2.3 s per pair, ~8 s per server start of its 16 GB).
    env_setup
    args=()
    [ -f "$RES/headtypes.json" ] && args=(--heads-from "$RES/headtypes.json")
    jargs=(--source "$QSOURCE" -r "$QRECIPE" --gpu-layers 999 --gpu-options --head-k "${HT_K:-4}"
      --head-limit "${HT_LIMIT:-6}" --head-types "${HT_TYPES:-F16,BF16,Q8_0,Q6_K,Q4_K}" --n-max-values "${JOINT_K:-3,4,5,6}"
      --p-min-values 0,0.75 --n-min-values 0 --seeds 42 --max-tokens "${MAXTOK:-128}" --budget "${JOINT_BUDGET:-96}")
    python3 -m ggufmtp tune-joint "$QMODEL" "${jargs[@]}" --dry-run > "$RES/joint-plan.txt" 2>&1 || true
    [ -z "${JOINT_HEADS:-}" ] || jargs+=(--joint-heads "$JOINT_HEADS")
    python3 -m ggufmtp tune-joint "$QMODEL" "${jargs[@]}" "${args[@]}" --recipe-out "$RES/joint-recipe.toml" \
      --output "$RES/joint.json" > "$RES/joint.txt" 2> "$RES/joint.log" || true
    # a headtypes.json carried from an earlier machine is used only when its model's and source's bytes
    # are these (tune-joint checks): else the heads stage is measured here, as without one
    if [ ! -s "$RES/joint.json" ] && [ ${#args[@]} -gt 0 ] && grep -q -- "--heads-from: measured with" "$RES/joint.log"; then
      mv "$RES/joint.log" "$RES/joint-heads-from.log"
      python3 -m ggufmtp tune-joint "$QMODEL" "${jargs[@]}" --recipe-out "$RES/joint-recipe.toml" \
        --output "$RES/joint.json" > "$RES/joint.txt" 2> "$RES/joint.log" || true
    fi
    tail -30 "$RES/joint.txt" ;;
  draftcost)
    # #52: where an MTP step's time goes (benchmarks/draft_cost.py): joint.json's configuration (its re-typed
    # head's sidecar found in the cache), else k=$HT_K with -bs; vanilla untraced and traced (-lv $DC_LV: 4 by
    # default, as the 2026-11-29 figures; 5 adds the CUDA graph lines, at more trace cost), then per window a
    # traced and an untraced MTP, $DC_LIMIT prompts x seed 42 -> draftcost.{json,md,txt}.
    # DC_K: windows to compare instead (DC_K=3,4,5,6,7: a row each, the verify batch's ms against its size;
    # it overrides joint.json's window, the rest of its configuration kept). Unset: one window, as before.
    # ~0.5 min per server start on the 35B-A3B: 4 starts for one window, 12 for DC_K=3,4,5,6,7.
    env_setup
    args=(--k "${DC_K:-${HT_K:-4}}" --server-arg=-bs)
    if [ -f "$RES/joint.json" ]; then
      args=(--tuned-from "$RES/joint.json" ${DC_K:+--k "$DC_K"})
      f=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])).get('joint') or {}; h=j.get('head')
rows=(j.get('heads_stage') or {}).get('rows') or []
print(next((r['file'] for r in rows if h not in (None, 'own') and r['head'] == h and r.get('file')), ''))" "$RES/joint.json")
      [ -z "$f" ] || args+=(--draft-model "$(find "$GGUFMTP_CACHE" -name "$f" | head -1)")
    fi
    python3 benchmarks/draft_cost.py "$QMODEL" "${args[@]}" --gpu-layers 999 --limit "${DC_LIMIT:-8}" --seeds 42 \
      --trace-level "${DC_LV:-4}" \
      --max-tokens "${MAXTOK:-128}" --json "$RES/draftcost.json" --md "$RES/draftcost.md" > "$RES/draftcost.txt" \
      2> "$RES/draftcost.log" || true
    cat "$RES/draftcost.txt" ;;
  joint-verify)
    # the joint result reproduced: $QSOURCE quantized with joint-recipe.toml (skipped when the search kept
    # $QMODEL's own head: the recipe is then $QRECIPE), then verify --tuned-from joint.json on it, the
    # whole suite unless $LIMIT -> verify-joint.*. Not sized to 8 min: the 35B-A3B quantization alone
    # takes several minutes on 16 cores.
    env_setup
    head=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['joint']['head'] or '')" "$RES/joint.json")
    if [ -n "$head" ]; then
      python3 -m ggufmtp quantize "$QSOURCE" --recipe "$RES/joint-recipe.toml" -o "$WORK/joint.gguf" -t "$(nproc)" \
        --no-progress --json > "$RES/joint-quantize.json" 2> "$RES/joint-quantize.log"
      QMODEL=$WORK/joint.gguf QRECIPE=$RES/joint-recipe.toml verify_tuned "$RES/joint.json" joint
    else
      verify_tuned "$RES/joint.json" joint
    fi
    tail -8 "$RES/verify-joint.txt" ;;
  dsynth)
    # #52 item 3: the dense Qwen3.6-27B-shaped BF16, $DLAYERS (64) trunk layers + blk.64, 57.2 GB in $WORK,
    # its head designed to the published 67.5% at k=4 (ggufmtp.synth.layout.PUBLISHED: 78 of 544 tokens
    # corrupted, 67.95% on the fair headline's prompts by the exact replay). Beside the build:
    # SYNTH_STAGE=dsynth STAGES=dense bash benchmarks/gpu/run_h200.sh all
    env_setup
    mkdir -p "$RES/dense"
    [ -f "$DBF16" ] && exit 0
    # DSHAPE=tiny DLAYERS=4: a CPU smoke run of the stages' mechanics (the same fraction, on the tiny twin)
    DSHAPE=${DSHAPE:-qwen3.6-27b}
    have=$(df -B1 --output=avail "$DWORK" | tail -1)  # the BF16 and the IQ4_XS quant (~15 GB) side by side
    [ "$DSHAPE" != qwen3.6-27b ] || [ "$have" -ge $(( 75 * 10**9 )) ] || { echo "dsynth: $WORK has" \
      "$((have / 10**9)) GB free in $DWORK, needs 75 GB (the BF16, then its quant beside it); remove" \
      "$WORK/qwen36-shape-bf16.gguf (72 GB) or use a fresh machine" >&2; exit 1; }
    f=$(python3 -c "from ggufmtp.synth.layout import PUBLISHED as P; print(P['qwen3.6-27b'].head.wrong_successor_fraction)")
    /usr/bin/time -v python3 -m ggufmtp synth "$DBF16" --arch qwen35 --shape "$DSHAPE" --layers "${DLAYERS:-64}" \
      --wrong-successor-fraction "$f" --json > "$RES/dense/synth.json" 2> "$RES/dense/synth.log" ;;
  dense)
    # #52 item 3: the dense model quantized with $DRECIPE (its receipt binds the BF16's sha256), the BF16
    # then deleted (DKEEP=1 keeps it: nothing below reads it, and /dev/shm is RAM), then $DENSE_STAGES
    # (the fair headline, tune and verify-tuned) on the quant, results in $RES/dense/. Any stage that
    # measures $QMODEL can be named there. Disk: 57 GB + 15 GB at the peak, so on nvidia-h200 it needs
    # $WORK without the 35B-A3B BF16 (STAGES=dense alone); nvidia-h200-x2 (256 GiB of RAM) should hold both.
    env_setup
    Q=$DWORK/dense-$DRECIPE.gguf
    mkdir -p "$RES/dense"
    if [ ! -f "$Q" ]; then
      [ -f "$DBF16" ] || bash "$0" dsynth
      /usr/bin/time -v python3 -m ggufmtp quantize "$DBF16" --recipe "$DRECIPE" -o "$Q" -t "$(nproc)" --no-progress \
        --json > "$RES/dense/quantize.json" 2> "$RES/dense/quantize.log"
      cp "$Q".receipt.json "$RES/dense/" 2>/dev/null || true
      # headtypes and joint re-type the BF16's head: it stays for them
      [ "${DKEEP:-0}" = 1 ] || [[ " ${DENSE_STAGES:-} " == *" headtypes "* || " ${DENSE_STAGES:-} " == *" joint "* ]] \
        || rm -f "$DBF16"
    fi
    for s in ${DENSE_STAGES:-fair tune verify-tuned}; do
      date +"%T   dense: $s" >> "$RES/progress.txt"
      QMODEL=$Q QRECIPE=$DRECIPE QSOURCE=$DBF16 RES=$RES/dense WORK=$DWORK HT_TYPES=${DHT_TYPES:-BF16,Q8_0,Q6_K,Q4_K} \
        JOINT_BUDGET=${DJOINT_BUDGET:-64} JOINT_K=${DJOINT_K:-${JOINT_K:-3,4,5,6}} JOINT_HEADS=${DJOINT_HEADS:-${JOINT_HEADS:-}} bash "$0" "$s" > "$RES/dense/stage-$s.out" 2>&1 \
        || date +"%T   dense: $s FAILED" >> "$RES/progress.txt"
    done ;;
  lsynth)
    # the two smaller Qwen3.6-shaped models of qgap and ladder (real per-layer shapes, fewer layers)
    env_setup
    for n in "${QLAYERS:-8}" "${LLAYERS:-4}"; do
      [ -f "$WORK/shape-L$n.gguf" ] || python3 -m ggufmtp synth "$WORK/shape-L$n.gguf" --shape qwen3.6-35b-a3b \
        --layers "$n" --wrong-successor-fraction "$WRONG" --json > "$RES/synth-L$n.json" 2> "$RES/synth-L$n.log"
    done ;;
  qgap)
    env_setup
    python3 benchmarks/quantize_gap.py --model "$WORK/shape-L${QLAYERS:-8}.gguf" --runs "${QRUNS:-2}" \
      --threads "$(nproc)" --dir "$WORK" --arms "${QARMS:-cli,bare,worker,inhash,outhash,ggufmtp}" \
      --json "$RES/qgap.json" 2>&1 | tee "$RES/qgap.txt" ;;
  ladder)
    # the same six recipes and imatrix twice, into fresh folders: in sequence, then as Dask tasks on a
    # 2-worker local cluster (worker i measures on GPU i); nvidia-smi samples each GPU every second
    env_setup
    M=$WORK/shape-L${LLAYERS:-4}.gguf
    [ -f "$WORK/ladder-imatrix.gguf" ] || python3 -m ggufmtp imatrix compute "$M" --corpus builtin:calib-v1 \
      -o "$WORK/ladder-imatrix.gguf" --chunks 8 -ngl 999 --mtp --no-progress --json > "$RES/ladder-imatrix.json" 2>&1
    R="-r q8_0-mtp -r benchmarks/gpu/ladder/q6_k-mtp.toml -r q4_k_m-mtp-q8 -r hifi-q4_k_m-mtp -r iq4_xs-mtp -r iq2_xxs-mtp"
    for mode in sequential parallel; do
      # quantization threads: every core in sequence, half of them per worker when two quantize at once
      extra="--quantize-threads $(nproc)"
      [ $mode = parallel ] && extra="--workers 2 --gpus 2 --quantize-threads $(( $(nproc) / 2 ))"
      rm -rf "$WORK/ladder-$mode"
      nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader -lms 1000 \
        > "$RES/ladder-$mode-util.csv" 2>/dev/null & u=$!
      s0=$(date +%s.%N)
      python3 -m ggufmtp ladder -m "$M" $R --imatrix "$WORK/ladder-imatrix.gguf" -o "$WORK/ladder-$mode" \
        --gpu-layers 999 --limit "${LLIMIT:-8}" --seeds 42 --max-tokens "${LMAXTOK:-64}" $extra --json \
        > "$RES/ladder-$mode.json" 2> "$RES/ladder-$mode.log" || true
      echo "$mode $(python3 -c "import time;print(round(time.time()-$s0,2))")" >> "$RES/ladder-wall.txt"
      kill $u 2>/dev/null || true
      cp "$WORK/ladder-$mode/README.md" "$RES/ladder-$mode-card.md" 2>/dev/null || true
    done
    cat "$RES/ladder-wall.txt" ;;
  rsynth)
    # the rehearsal's model: $RLAYERS trunk layers + the MTP block, the real per-layer shapes ($RSHAPE)
    env_setup
    M=$WORK/rehearsal-L${RLAYERS:-10}.gguf
    [ -f "$M" ] || python3 -m ggufmtp synth "$M" --shape "${RSHAPE:-qwen3.6-35b-a3b}" --layers "${RLAYERS:-10}" \
      --wrong-successor-fraction "$WRONG" --json > "$RES/rehearsal-synth.json" 2> "$RES/rehearsal-synth.log" ;;
  rehearsal)
    # issue #41 item 7. The imatrix (with the MTP head's statistics) is computed once, first, and given
    # to both runs; each run goes into a fresh folder. In sequence: every server on GPU 0 (so a measure
    # task's seconds are one GPU's), quantization on every core, the sidecar after the ladder. Concurrent:
    # $RGPUS workers, worker i on GPU i, cores / workers threads each, the sidecar (as many threads)
    # started beside the ladder. The release's wall is the ladder's and the sidecar's together.
    env_setup
    L=${RLAYERS:-10}; G=${RGPUS:-4}; N=$(nproc)
    M=$WORK/rehearsal-L$L.gguf; IM=$WORK/rehearsal-imatrix.gguf
    [ -f "$M" ] || bash "$0" rsynth
    [ -f "$IM" ] || python3 -m ggufmtp imatrix compute "$M" --corpus builtin:calib-v1 -o "$IM" --chunks 8 -ngl 999 \
      --mtp --no-progress --json > "$RES/rehearsal-imatrix.json" 2> "$RES/rehearsal-imatrix.log"
    R="-r q8_0-mtp -r q4_k_m-mtp-q8 -r hifi-q4_k_m-mtp -r iq4_xs-mtp"
    V="--gpu-layers 999 --limit ${RLIMIT:-8} --seeds 42 --max-tokens ${RMAXTOK:-64}"
    TF='{"name": "sidecar", "seconds": %e, "user": %U, "sys": %S}'
    for mode in ${RMODES:-sequential parallel}; do
      D=$WORK/rehearsal-$mode; P=$RES/rehearsal-$mode; rm -rf "$D"; mkdir -p "$D"
      sidecar=(/usr/bin/time -f "$TF" -o "$P-sidecar-time.json" python3 -m ggufmtp sidecar "$M" -r q8_0-mtp
               -o "$D/mtp-rehearsal-L$L-Q8_0.gguf" --json)
      nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader -lms 1000 \
        > "$P-util.csv" 2>/dev/null & u=$!
      date +"%T   rehearsal: $mode" >> "$RES/progress.txt"
      s0=$(date +%s.%N)
      if [ $mode = sequential ]; then
        CUDA_VISIBLE_DEVICES=0 python3 -m ggufmtp ladder -m "$M" $R --imatrix "$IM" -o "$D" $V --quantize-threads "$N" --json \
          > "$P.json" 2> "$P.log" || true
        "${sidecar[@]}" --quantize-threads "$N" > "$P-sidecar.json" 2> "$P-sidecar.log" || true
      else
        # every build (and the sidecar) may use every core, the ladder's default: with N/G threads each
        # (2026-11-28, 16 of 64) the cheap builds ended first and iq4_xs-mtp's then ran 117 s on 16 threads
        # beside 48 idle cores (wall 2.23x the bound); shared cores let the OS hand a finished build's
        # cores to the ones still running. RTHREADS=per-worker restores the split for a comparison.
        T=(); [ "${RTHREADS:-all}" = per-worker ] && T=(--quantize-threads $(( N / G )))
        "${sidecar[@]}" "${T[@]}" > "$P-sidecar.json" 2> "$P-sidecar.log" & sc=$!
        python3 -m ggufmtp ladder -m "$M" $R --imatrix "$IM" -o "$D" $V --workers "$G" --gpus "$G" \
          "${T[@]}" --json > "$P.json" 2> "$P.log" || true
        wait $sc || true
      fi
      echo "$mode $(python3 -c "import time;print(round(time.time()-$s0,2))")" >> "$RES/rehearsal-wall.txt"
      kill $u 2>/dev/null || true
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['cpu_seconds']=round(d.pop('user')+d.pop('sys'),2)
json.dump(d,open(sys.argv[1],'w'))" "$P-sidecar-time.json" || true
      cp "$D/README.md" "$P-card.md" 2>/dev/null || true
      mkdir -p "$P-receipts"; cp "$D"/*/*.receipt.json "$D"/*.receipt.json "$P-receipts/" 2>/dev/null || true
      rm -rf "$D"  # the next run's memory (receipts and card kept)
    done
    cat "$RES/rehearsal-wall.txt"
    # RSEQ: an earlier sequential run's files (rehearsal-sequential.json and -sidecar-time.json) when
    # RMODES=parallel runs the concurrent half alone (a rerun on a machine of the same kind)
    S=${RSEQ:-$RES}/rehearsal-sequential; C=$RES/rehearsal-parallel
    wall=$(awk '$1=="parallel"{print $2}' "$RES/rehearsal-wall.txt" | tail -1)
    { echo "== the release (ladder + sidecar beside it), wall $wall s"
      python3 benchmarks/ladder_bound.py "$S.json" "$C.json" --job "$S-sidecar-time.json" --wall "$wall" \
        --json "$RES/rehearsal-bound.json"
      echo; echo "== the ladder alone (its own wall; the sidecar ran beside it)"
      python3 benchmarks/ladder_bound.py "$S.json" "$C.json"; } 2>&1 | tee "$RES/rehearsal-bound.txt" ;;
  search)
    # issue #43's GPU half: the gpu-small trained model (study-train, if not done), its inputs from the
    # training corpus's held-out split (the KLD text, $SPROMPTS verify prompts; the imatrix on its train
    # split), the imatrix with the head, then the search at hifi-q4_k_m-mtp's and iq2_xxs-mtp's size,
    # each proved against that recipe in one interleaved run -> $RES/search/. One call on nvidia-h200:
    #   BUILD_STAGE=study-build SYNTH_STAGE=study-train STAGES=search setsid nohup bash ... all &
    # $SWORKERS (4) measure at once on the one GPU (the quantization is CPU work), $SLPG (4) trunk layers a
    # group: about 10 types x 12 groups of the 8-layer model. CPU smoke run (no training, this venv):
    #   PATH=$PWD/.venv/bin:$PATH SITE=$PWD/.venv/lib/python3.11/site-packages SMODEL=builtin:tiny-qwen35moe-trained \
    #   SPROMPTS=4 SBUDGETS=hifi-q4_k_m-mtp STYPES=Q8_0,Q5_0,Q4_0 SNGL=0 SWORKERS=2 SLPG=2 SCHUNKS=4 \
    #   GGUFMTP_RUNTIME_VARIANT=cpu GGUFMTP_CACHE=$HOME/.cache/ggufmtp RES=/tmp/smoke bash benchmarks/gpu/run_h200.sh search
    env_setup
    S=$WORK/study; R=$RES/search; mkdir -p "$R"
    M=${SMODEL:-$S/trained-bf16.gguf}
    [ -n "${SMODEL:-}" ] || [ -f "$M" ] || bash "$0" study-train
    python3 - "$CARRY/corpus-stdlib-full.jsonl" "$R" "${SPROMPTS:-160}" <<'PY'
import importlib.util, json, sys
from pathlib import Path
corpus, out, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
spec = importlib.util.spec_from_file_location("lhs", "benchmarks/learned_head_study.py")
lhs = importlib.util.module_from_spec(spec); sys.modules["lhs"] = lhs; spec.loader.exec_module(lhs)
conv = {}
for line in corpus.open():
    d = json.loads(line)
    conv.setdefault(d.get("split"), []).append(d)
lhs.write_text_sample(out / "calib.txt", conv["train"], 200_000)
lhs.write_text_sample(out / "eval-heldout.txt", conv["heldout"], 200_000)
lhs.write_suite(out / "suite-heldout.jsonl", conv["heldout"], n)
PY
    IM=$R/imatrix.gguf; G=${SNGL:-999}
    [ -f "$IM" ] || python3 -m ggufmtp imatrix compute "$M" --corpus "$R/calib.txt" -o "$IM" --mtp -ngl "$G" \
      --no-progress --json > "$R/imatrix.json" 2> "$R/imatrix.log"
    for b in ${SBUDGETS:-hifi-q4_k_m-mtp iq2_xxs-mtp}; do
      date +"%T   search: $b" >> "$RES/progress.txt"
      python3 -m ggufmtp --no-progress search "$M" --budget "$b" --imatrix "$IM" --corpus "$R/eval-heldout.txt" \
        --types "${STYPES:-Q8_0,Q6_K,Q5_K,Q4_K,IQ4_XS,Q3_K,IQ3_XXS,Q2_K,IQ2_XS,IQ2_XXS}" --layers-per-group "${SLPG:-4}" \
        --chunks "${SCHUNKS:-16}" --prove --suite "$R/suite-heldout.jsonl" --seeds 42 --max-tokens "${SMAXTOK:-128}" \
        -ngl "$G" --workers "${SWORKERS:-4}" -o "$R/searched-$b.toml" --plot "$R/searched-$b.svg" --json > "$R/search-$b.json" 2> "$R/search-$b.log" || true
      python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['proof']; print(sys.argv[2], p['verdict'], '|', p['reason'])" \
        "$R/search-$b.json" "$b" | tee -a "$R/verdicts.txt" || true
    done ;;
  study-build)
    # the CUDA build at low priority: the training beside it is launch-bound on one CPU thread
    exec nice -n 10 bash "$0" build ;;
  study-train)
    # issue #29: the GPU model of the learned-head study (`ggufmtp train`, then both heads converted with
    # the pinned converter from the carried llama.cpp tree). The model cannot come back (files <= 16 MiB):
    # reproduce.json records what it takes to train it again (preset, steps, seed, the corpus's sha256,
    # the trainer's sources, the hardware and library versions), train.json / train-log.jsonl the run.
    env_setup
    S=$WORK/study; R=$RES/study; mkdir -p "$S" "$R"
    [ -f "$R/t0" ] || date +%s > "$R/t0"   # the study's clock: its --budget counts from here
    C=$CARRY/corpus-stdlib-full.jsonl
    [ -f "$C" ] || { echo "missing $C: on a machine with Python 3.11.7 run" \
      "python3 -m ggufmtp train --preset gpu-small --write-corpus $C" >&2; exit 1; }
    [ -f "$S/trained-bf16.gguf" ] && [ -f "$S/initial-bf16.gguf" ] && exit 0
    P=${STUDY_PRESET:-gpu-small}; N=${STUDY_STEPS:-800}; SEED=${STUDY_SEED:-1234}
    python3 - "$C" "$P" "$N" "$SEED" "${STUDY_DEVICE:-cuda}" > "$R/reproduce.json" <<'PY'
import hashlib, json, pathlib, platform, subprocess, sys
corpus, preset, steps, seed, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def sha(p): return hashlib.sha256(pathlib.Path(p).read_bytes()).hexdigest()
def run(*a):
    try: return subprocess.run(a, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as e: return f"unavailable: {e}"
mods = {}
for m in ("torch", "transformers", "tokenizers", "numpy"):
    try: mods[m] = __import__(m).__version__
    except Exception as e: mods[m] = f"unavailable: {e}"
try:
    import torch; cuda = {"cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
except Exception as e: cuda = {"error": str(e)}
first = json.loads(pathlib.Path(corpus).open().readline())
print(json.dumps({
    "command": f"python3 -m ggufmtp train OUT --preset {preset} --steps {steps} --seed {seed} --device {device} --corpus {pathlib.Path(corpus).name} --no-convert",
    "preset": preset, "steps": steps, "seed": seed,
    "corpus": {"file": pathlib.Path(corpus).name, "sha256": sha(corpus), "bytes": pathlib.Path(corpus).stat().st_size,
               "digest": first.get("digest"), "origin": first.get("origin"),
               "regenerate": f"python3 -m ggufmtp train --preset {preset} --write-corpus FILE (Python {(first.get('origin') or {}).get('python')})"},
    "trainer_sources_sha256": {p.name: sha(p) for p in sorted(pathlib.Path("ggufmtp/train").glob("*.py"))},
    "git_head": run("git", "rev-parse", "HEAD") or "no .git on this machine (working-tree copy)",
    "python": platform.python_version(), "modules": mods, "cuda": cuda,
    "gpu": run("nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"),
    "cpu": run("sh", "-c", "grep -m1 'model name' /proc/cpuinfo; nproc"), "os": platform.platform()}, indent=1))
PY
    date +"%T   study-train: training $P, $N steps" >> "$RES/progress.txt"
    /usr/bin/time -v python3 -m ggufmtp train "$S/run" --preset "$P" --steps "$N" --seed "$SEED" --device "${STUDY_DEVICE:-cuda}" \
      --corpus "$C" --no-convert --json > "$R/train-stdout.json" 2> "$R/train.err"
    cp "$S/run/train.json" "$S/run/train-log.jsonl" "$R/"
    date +"%T   study-train: converting" >> "$RES/progress.txt"
    for h in trained initial; do  # the two conversions at once (the converter's imports dominate)
      python3 -m ggufmtp convert "$S/run/qwen35moe-$P-$h-head" -o "$S/$h-bf16.gguf" --json \
        > "$R/convert-$h.json" 2> "$R/convert-$h.log" &
    done
    wait
    cp "$S"/trained-bf16.gguf.source.json "$S"/initial-bf16.gguf.source.json "$R/" 2>/dev/null || true
    [ -f "$S/trained-bf16.gguf" ] && [ -f "$S/initial-bf16.gguf" ] ;;
  study)
    # issue #29: benchmarks/learned_head_study.py on the GPU model, every part, with a --budget that ends
    # it $STUDY_END_S (default 1260 s = 21 min) after study-train started: with ~2 min of machine start
    # and the collection, the run holds one H100 ~24 of its 25 minutes (estimate: the script's docstring)
    env_setup
    S=$WORK/study; R=$RES/study; mkdir -p "$R"
    [ -f "$S/trained-bf16.gguf" ] && [ -f "$S/initial-bf16.gguf" ] || bash "$0" study-train
    left=$(( $(cat "$R/t0") + ${STUDY_END_S:-1260} - $(date +%s) ))
    [ "$left" -ge 120 ] || left=120   # late (a slow start or training): still the head rows' core
    date +"%T   study: harness, budget ${left} s" >> "$RES/progress.txt"
    python3 benchmarks/learned_head_study.py "$S/trained-bf16.gguf" --initial-head "$S/initial-bf16.gguf" \
      --corpus "$CARRY/corpus-stdlib-full.jsonl" --out "$R" --work "$S/work" -ngl 999 \
      --suite "${STUDY_SUITE:-heldout:12}" --template-suites "${STUDY_TEMPLATE_SUITES:-main,chat-v1}" --seeds "${STUDY_SEEDS:-42,1337}" --max-tokens "${STUDY_MAXTOK:-128}" \
      --parts "${STUDY_PARTS:-head,imatrix,trunk,window,template,kv}" --budget "$left" ${STUDY_ARGS:-} \
      > "$R/study.out" 2>&1 || true
    tail -c 4000 "$R/study.md" ;;
  numerics)
    # verify's numerics analysis on a GPU (learned-head study, run A's model): the trained model
    # (study-train, if not done) at hifi-q4_k_m-mtp, verified on the study's held-out suite; every
    # difference from vanilla analysed on the vanilla server (measure/verify/divergence.py)
    env_setup
    S=$WORK/study; mkdir -p "$RES/study"
    [ -f "$S/trained-bf16.gguf" ] || bash "$0" study-train
    python3 -m ggufmtp --no-progress quantize "$S/trained-bf16.gguf" -r hifi-q4_k_m-mtp -o "$S/numerics-q4km.gguf" \
      --json > "$RES/numerics-quantize.json" 2> "$RES/numerics-quantize.log" || true
    python3 -m ggufmtp --no-progress verify "$S/numerics-q4km.gguf" -ngl 999 --seeds 42,1337 --max-tokens 128 \
      --draft-n-max 3 --suite benchmarks/gpu/results-2026-11-26-h100-study/study/inputs/suite-heldout.jsonl \
      --out "$RES/numerics-gpu.json" > "$RES/numerics-gpu.txt" 2> "$RES/numerics-gpu.log" || true
    cat "$RES/numerics-gpu.txt" ;;
  tune-trained)
    # tune on the learned head (after `numerics`, which makes the Q4_K_M file): a configuration whose
    # replies differ from vanilla only where the numerics analysis explains it stays in the search
    env_setup
    S=$WORK/study
    [ -f "$S/numerics-q4km.gguf" ] || bash "$0" numerics
    python3 -m ggufmtp --no-progress tune "$S/numerics-q4km.gguf" -ngl 999 --seeds 42 --max-tokens 128 \
      --budget "${TBUDGET:-160}" --suite benchmarks/gpu/results-2026-11-26-h100-study/study/inputs/suite-heldout.jsonl \
      --out "$RES/tune-trained.json" > "$RES/tune-trained.txt" 2> "$RES/tune-trained.log" || true
    tail -30 "$RES/tune-trained.txt" ;;
  gopt-determinism)
    # is vanilla deterministic with GGML_CUDA_GRAPH_OPT=1? (after `numerics`: the trained Q4_K_M file)
    env_setup
    S=$WORK/study
    [ -f "$S/numerics-q4km.gguf" ] || bash "$0" numerics
    python3 benchmarks/gpu/gopt_determinism.py "$S/numerics-q4km.gguf" \
      benchmarks/gpu/results-2026-11-26-h100-study/study/inputs/suite-heldout.jsonl "$RES/gopt.json" | tee "$RES/gopt.txt" ;;
  memplan)
    # issue #49 item 6: the publisher's GPU. A ballast process holds all but $FREE80 GiB of the H200
    # (an 80 GB card), then `ggufmtp run` with default settings (Hi-Fi, the BF16 source as the
    # reference, -ngl 999); then all but $FREE24 GiB (a 24 GB card) and `verify --n-cpu-moe N`, N as
    # the memory plan's refusal names it. nvidia-smi samples used memory every 0.5 s -> memplan-smi.csv,
    # each phase's start time -> memplan-phases.txt.
    env_setup
    M=$WORK/qwen36-shape-bf16.gguf
    ph() { date +"%s.%N $1" >> "$RES/memplan-phases.txt"; }
    ballast() {  # hold all but $1 GiB of GPU 0 until killed
      python3 -c "import sys,time,torch; free,_=torch.cuda.mem_get_info(); n=free-int(float(sys.argv[1])*2**30); \
x=torch.empty(n,dtype=torch.uint8,device='cuda'); print('ballast GiB', n/2**30, flush=True); time.sleep(10**6)" "$1" &
      BAL=$!; sleep 20; nvidia-smi --query-gpu=memory.used,memory.free --format=csv | tee -a "$RES/memplan-ballast.txt"; }
    nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 500 > "$RES/memplan-smi.csv" & SMI=$!
    ph start; ballast "${FREE80:-78}"; ph run80
    /usr/bin/time -v python3 -m ggufmtp run --model "$M" --recipe hifi-q4_k_m-mtp -o "$WORK/run80" --gpu-layers 999 \
      --json > "$RES/memplan-run80.json" 2> "$RES/memplan-run80.log" || true
    ph run80-end; kill $BAL; sleep 5
    A=$(ls "$WORK"/run80/*.gguf | head -1)
    cp "$WORK"/run80/*.receipt.json "$RES/" 2>/dev/null || true
    ballast "${FREE24:-23}"; ph plan24
    python3 -m ggufmtp verify "$A" --gpu-layers 999 --seeds 42 --limit "${LIMIT24:-16}" --recipe hifi-q4_k_m-mtp \
      > "$RES/memplan-refused24.txt" 2>&1 || true
    N=$(grep -o -- '--n-cpu-moe [0-9]*' "$RES/memplan-refused24.txt" | head -1 | awk '{print $2}')
    ph "verify24 n-cpu-moe=${N:-none}"
    /usr/bin/time -v python3 -m ggufmtp verify "$A" --gpu-layers 999 --n-cpu-moe "${N:-40}" --seeds 42 \
      --limit "${LIMIT24:-16}" --recipe hifi-q4_k_m-mtp --json -o "$RES/memplan-verify24-full.json" \
      > "$RES/memplan-verify24.json" 2> "$RES/memplan-verify24.log" || true
    ph end; kill $BAL $SMI || true ;;
  cputests)
    # the suite's numerical tests on this machine's CPU, another CPU than the developers' (#49 item 7):
    # a CPU-only runtime of the pinned commit in a cache of its own (the CUDA build runs beside it),
    # the working tree's package and tests, pinned to $TEST_CORES cores (other thread counts than a
    # 2-core machine's); the trained builtin is trained here (its corpus is this Python's standard
    # library, so the model differs from a developer's: a held-out check of the designed margins);
    # testwheels: hub 2.x and what it and transformers >= 5.18 need beyond this image
    env_setup
    unset PYTHONSAFEPATH
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/testsite "$CARRY"/testwheels/*.whl
    # the tests run from a copy: the device tool copies the working tree again at each call, and a
    # call made while they run (a `wait`) replaced the package under them (2026-11-29: a module
    # "not found" and a llama-perplexity that failed, mid-run)
    T=/tmp/cputree; rm -rf "$T"; mkdir -p "$T"; cp -r ggufmtp tests recipes pyproject.toml "$T"/
    export PYTHONPATH=$SITE:/tmp/testsite:$T:$PWD/$CARRY/pylib GGUFMTP_RUNTIME_VARIANT=cpu GGUFMTP_CACHE=/tmp/ggufmtp-cache-cpu
    lscpu | grep -E "Model name|^CPU\(s\)" > "$RES/cputests-cpu.txt"
    cd "$T"
    taskset -c "${TEST_CORES:-0-5}" python3 -m ggufmtp runtime build -j 6 --json > "$RES/cputests-build.json" 2> "$RES/cputests-build.log"
    timeout "${TEST_LIMIT:-420}" taskset -c "${TEST_CORES:-0-5}" python3 -m pytest -p no:cacheprovider -q --durations=15 \
      ${TESTS:-tests/test_search_allocate.py tests/test_head_same_trunk.py tests/test_head_sequential.py tests/test_trained.py \
      tests/test_verify_numerics.py tests/test_numerics_bounds.py tests/test_synth_dense.py tests/test_head_reference.py} \
      > "$RES/cputests.txt" 2>&1 || true ;;
  synth-and-train)
    # the 72 GB model (synth) and the study's trained model at once, beside the build
    bash "$0" synth > "$RES/stage-synth-only.out" 2>&1 & s=$!
    bash "$0" study-train > "$RES/stage-study-train.out" 2>&1 || true
    wait $s ;;
  all)
    new_progress
    env_setup  # once, before the parallel stages (two concurrent pip installs into /tmp/site collide)
    bash "$0" "${BUILD_STAGE:-build}" > "$RES/stage-build.out" 2>&1 &
    b=$!
    bash "$0" "${SYNTH_STAGE:-synth}" > "$RES/stage-synth.out" 2>&1 \
      || { date +"%T synth FAILED" >> "$RES/progress.txt"; wait $b; exit 1; }
    wait $b || { date +"%T build FAILED" >> "$RES/progress.txt"; exit 1; }
    date +"%T built" >> "$RES/progress.txt"
    export QUANT_CLI=${QUANT_CLI:-0}
    run_stages ${STAGES:-quantize tune verify-tuned profiles verify curve} ;;
  both)
    # nvidia-h200-x2: the 35B-A3B chain and the dense 27B chain at once, one GPU each. The build and both
    # syntheses first (every core; the dense BF16 on disk in $DWORK), then both quantizations (16 cores
    # each: `quantize`'s and `dense`'s -t is nproc, which the pinning sets), then $STAGES on GPU 0 (cores
    # 0-11) and $DENSE_STAGES on GPU 1 (cores 12-23), with cputests ($TESTS) on cores 24-31 beside them.
    # Measured 2026-11-29 (results-2026-11-29e-h200x2-joint): build + syntheses 4.7 min, quantizations 4.7
    # min (hifi 277 s; dense q4_k_m-mtp-q8), headtypes 4.0 / 5.5 min (35B-A3B 4 types / dense 3), joint
    # 6.1 / 4.5 min (budget 64 / 48), draftcost 0.7 / 1 min, joint-verify 7.5 min (the F16-head recipe
    # quantized again, then 16 prompts x 2 seeds); the machine was held 29 min in all (three calls).
    # CPU smoke run: SHAPE=tiny LAYERS=2 DSHAPE=tiny DLAYERS=4 GGUFMTP_RUNTIME_VARIANT=cpu BUILD_STAGE=cpu-build
    new_progress
    env_setup
    # room: the two BF16s and their quants are ~166 GB; this kind's tmpfs may be sized from the memory
    # the machine had at boot (it grows as it is used), so it is enlarged where it can be, and the dense
    # files go to disk where it cannot
    gb() { df -BG --output=avail "$1" | tail -1 | tr -dc 0-9; }
    [ "$(gb "$WORK")" -ge 200 ] || mount -o remount,size=240G "$(df --output=target "$WORK" | tail -1)" 2>/dev/null || true
    if [ "$DWORK" = "$WORK" ] && [ "$(gb "$WORK")" -lt 200 ]; then DWORK=/var/tmp/ggufmtp-dense; mkdir -p "$DWORK"; fi
    df -h "$WORK" "$DWORK" > "$RES/df.txt"
    export QUANT_CLI=0 DWORK
    bash "$0" "${BUILD_STAGE:-build}" > "$RES/stage-build.out" 2>&1 & b=$!
    bash "$0" synth > "$RES/stage-synth.out" 2>&1 & s=$!
    bash "$0" dsynth > "$RES/stage-dsynth.out" 2>&1 & d=$!
    wait $s || date +"%T synth FAILED" >> "$RES/progress.txt"
    wait $d || date +"%T dsynth FAILED" >> "$RES/progress.txt"
    wait $b || { date +"%T build FAILED" >> "$RES/progress.txt"; exit 1; }
    date +"%T built" >> "$RES/progress.txt"
    c0=${CORES0:-0-15} c1=${CORES1:-16-31}
    taskset -c "$c0" bash "$0" quantize > "$RES/stage-quantize.out" 2>&1 & q=$!
    DKEEP=1 DENSE_STAGES=" " taskset -c "$c1" bash "$0" dense > "$RES/stage-dquantize.out" 2>&1 & dq=$!
    wait $q || date +"%T quantize FAILED" >> "$RES/progress.txt"
    wait $dq || date +"%T dense quantize FAILED" >> "$RES/progress.txt"
    date +"%T quantized" >> "$RES/progress.txt"
    pids=()
    if [ -n "${CPUTESTS-1}" ]; then
      ( TEST_CORES=${TEST_CORES:-24-31} bash "$0" cputests > "$RES/stage-cputests.out" 2>&1
        date +"%T cputests finished" >> "$RES/progress.txt" ) & pids+=($!)
    fi
    ( CUDA_VISIBLE_DEVICES=0 NO_DONE=1 STAGES=${STAGES:-headtypes joint draftcost joint-verify} taskset -c "${GCORES0:-0-11}" \
        bash "$0" stages > "$RES/stage-gpu0.out" 2>&1; date +"%T gpu0 finished" >> "$RES/progress.txt" ) & pids+=($!)
    ( CUDA_VISIBLE_DEVICES=1 DENSE_STAGES=${DENSE_STAGES:-headtypes joint draftcost joint-verify} taskset -c "${GCORES1:-12-23}" \
        bash "$0" dense > "$RES/stage-gpu1.out" 2>&1; date +"%T gpu1 finished" >> "$RES/progress.txt" ) & pids+=($!)
    wait "${pids[@]}"
    date +"%T done" >> "$RES/progress.txt" ;;
  detach)
    # more stages on a machine where `all` has finished: detached from the calling shell, because
    # the device tool stops what a call started when the call ends (a plain `&` job dies with it)
    new_progress
    setsid nohup bash "$0" stages > "$RES/detach.out" 2>&1 < /dev/null &
    echo "started: ${STAGES:?set STAGES}" ;;
  stages)
    run_stages ${STAGES:?set STAGES} ;;
  wait)
    # a call that finds a fresh machine (the warm one went back between calls) has nothing to wait for:
    # say so at once instead of spending the wait's device time on a bare machine
    [ -f "$RES/progress.txt" ] || { echo "nothing runs here: no $RES/progress.txt (a fresh machine)"; exit 3; }
    end=$((SECONDS + ${2:-560}))
    while [ $SECONDS -lt $end ] && ! grep -q done "$RES/progress.txt" 2>/dev/null; do sleep 5; done
    bash "$0" collect ;;
  collect)
    mkdir -p "$OUT"
    cp "$WORK"/*.receipt.json "$RES/" 2>/dev/null || true
    tar czf "$OUT/gpu-results.tar.gz" -C "$RES" --exclude='*.gguf' . && ls -la "$OUT"
    cat "$RES/progress.txt" 2>/dev/null || true
    last=$(ls -t "$RES"/stage-*.out 2>/dev/null | head -1 || true)
    [ -n "$last" ] && { echo "== $last"; tail -c 3000 "$last"; } || true ;;
  *) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
