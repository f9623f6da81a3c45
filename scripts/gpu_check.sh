#!/usr/bin/env bash
# GPU checks, meant to finish within 5 minutes on one GPU: the `gpu` tests (the Triton kernel
# compiled for the device, a CUDA graph capturing a guided step with host functions, the engine's
# decode-step graphs against eager), the apply-kernel benchmark against a device-to-device copy
# at vocab 128,256 and 151,936, batch 1..256, and the end-to-end engine with CUDA graphs on and
# off (tiny-random, batch 8, 64 tokens, JSON schema: identical outputs, tokens/s of both).
# Each step's timeout is cut to what is left of a 290 s budget counted from the first step.
# Writes $OUT/gpu_check.json (or bench-out/gpu_check/ without $OUT).
# Usage: bash scripts/gpu_check.sh   (from the repository root). It runs on the machine's python3
# when that has a CUDA torch (with the wheels in .whl/, if any, for what it lacks), else it builds
# .venv-gpu with a CUDA torch from the registry.
set -uo pipefail
OUT="${OUT:-bench-out/gpu_check}"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY="${PYTHON:-python3}"
if "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    # The machine's own Python already has a CUDA torch (a GPU image): run on it, from the source
    # tree. Wheels in .whl/ stand in for a registry the machine cannot reach.
    VPY="$PY"
    SITE="${TMPDIR:-/tmp}/guidedec-gpu-site"
    if compgen -G ".whl/*.whl" > /dev/null; then
        "$PY" -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$SITE" .whl/*.whl
    fi
    export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
else
    if [ ! -x .venv-gpu/bin/python ]; then
        "$PY" -m venv .venv-gpu
        .venv-gpu/bin/python -m pip install --quiet --upgrade pip
        # A CUDA build of torch (the default PyPI wheel is CUDA).
        .venv-gpu/bin/python -m pip install --quiet torch
        .venv-gpu/bin/python -m pip install --quiet -e ".[dev]"
    fi
    VPY=.venv-gpu/bin/python
fi
"$VPY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())" | tee "$OUT/device.txt"
start=$(date +%s)
left() {  # seconds for the next step: at most $1, and no more than the budget has left
    local rest=$(( 290 - ($(date +%s) - start) ))
    echo $(( rest < $1 ? (rest > 10 ? rest : 10) : $1 ))
}
# The files that hold `gpu` tests, named so that collection imports nothing a GPU image may lack.
mapfile -t gpu_files < <(grep -rlE "pytest\.mark\.gpu|mark\.gpu" tests --include="test_*.py")
timeout "$(left 150)" "$VPY" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" "${gpu_files[@]}" \
    > "$OUT/gpu_tests.txt" 2>&1
tests_rc=$?
tail -5 "$OUT/gpu_tests.txt"
timeout "$(left 120)" "$VPY" -m guidedec bench gpu-apply --out "$OUT/apply" > "$OUT/apply.txt" 2>&1
bench_rc=$?
cat "$OUT/apply.txt"
timeout "$(left 60)" "$VPY" -m guidedec bench graphs --device cuda --batch 8 --tokens 64 \
    --out "$OUT/graphs" > "$OUT/graphs.txt" 2>&1
graphs_rc=$?
tail -3 "$OUT/graphs.txt"
"$VPY" - "$OUT" "$tests_rc" "$bench_rc" "$start" "$graphs_rc" <<'PY'
import json, pathlib, sys, time
out, tests_rc, bench_rc, start = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
graphs_rc = int(sys.argv[5])
apply = out / "apply" / "bench_gpu_apply.json"
graphs = out / "graphs" / "bench_graphs.json"
summary = {
    "device": (out / "device.txt").read_text().strip(),
    "gpu_tests_rc": tests_rc,
    "gpu_tests_tail": (out / "gpu_tests.txt").read_text().splitlines()[-3:],
    "apply_bench_rc": bench_rc,
    "apply": json.loads(apply.read_text())["rows"] if apply.exists() else None,
    "graphs_bench_rc": graphs_rc,
    "graphs_tail": (out / "graphs.txt").read_text().splitlines()[-5:],
    "graphs": json.loads(graphs.read_text()) if graphs.exists() else None,
    "seconds": time.time() - start,
}
(out / "gpu_check.json").write_text(json.dumps(summary, indent=2))
print(f"wrote {out / 'gpu_check.json'}")
PY
exit $(( tests_rc != 0 || bench_rc != 0 || graphs_rc != 0 ))
