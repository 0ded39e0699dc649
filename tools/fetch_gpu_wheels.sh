#!/usr/bin/env bash
# Download into .whl/ the wheels the GPU machine lacks (docs/gpu.md, issue 33): CPython 3.12,
# manylinux x86_64, one version of each, no dependencies resolved by pip (each is named).
#
#   tools/fetch_gpu_wheels.sh            # into .whl/ (ignored by git; carried with carry: [".whl"])
#   PYTHON=python3.11 tools/fetch_gpu_wheels.sh DIR
#
# Which: the runtime dependencies in pyproject.toml that the GPU machine's image does not hold
# (/work/.library/device/KINDS.md: zarr, numcodecs, crc32c, pymetis are missing), at the
# versions this project's CPU environment runs, plus what they require that the image lacks:
# zarr 3.1 needs donfig and google-crc32c (numpy, packaging, typing_extensions and pyyaml
# are there). The image's own torch, numpy, pandas, scipy and tqdm are used as they are.
# The wheels' Requires-Dist lines are printed at the end for a reader to check.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
PY=${PYTHON:-python3}

# name==version; keep one version of each (two versions of one package stop the install there).
WHEELS=(
  zarr==3.1.6            # pyproject: zarr>=3.1,<3.2
  numcodecs==0.16.6      # pyproject: numcodecs>=0.16,<0.17
  crc32c==2.9.post0      # pyproject: crc32c>=2.4
  pymetis==2025.2.2      # pyproject: pymetis>=2023.1
  donfig==0.8.1.post1    # zarr: donfig>=0.8
  google-crc32c==1.9.0   # zarr: google-crc32c>=1.5
)
# pip matches a manylinux tag exactly: the common ones, and the glibc levels wheels use often.
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64)

mkdir -p "$DEST"
platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
for spec in "${WHEELS[@]}"; do
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platform_args[@]}" -d "$DEST" "$spec"
done

# One version of each: a wheel of another version left by an earlier run is removed.
keep=()
for spec in "${WHEELS[@]}"; do
  name=${spec%%==*}; version=${spec#*==}
  keep+=("$(echo "$name" | tr - _)-$version-")
done
for f in "$DEST"/*.whl; do
  base=$(basename "$f")
  ok=0
  for k in "${keep[@]}"; do [[ ${base,,} == ${k,,}* ]] && ok=1; done
  if [[ $ok == 0 ]]; then echo "removing $base (not in the list)"; rm -f "$f"; fi
done

count=$(ls "$DEST"/*.whl | wc -l)
if [[ $count != "${#WHEELS[@]}" ]]; then
  echo "error: $count wheels in $DEST, expected ${#WHEELS[@]}" >&2
  exit 1
fi
total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
if (( total > 40 * 1024 * 1024 )); then
  echo "error: $DEST holds $((total >> 20)) MiB; the working tree that travels is limited to 64 MiB" >&2
  exit 1
fi
if git check-ignore -q "$DEST/$(basename "$(ls "$DEST"/*.whl | head -1)")"; then
  ignored="ignored by git"
else
  ignored="NOT ignored by git: add /$DEST/ to .gitignore"
fi
for f in "$DEST"/*.whl; do
  printf '%8d KiB  %s\n' $(( $(stat -c %s "$f") >> 10 )) "$(basename "$f")"
  unzip -p "$f" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' \
    | sed 's/^Requires-Dist: /            needs /' || true
done
echo "$count wheels, $((total >> 10)) KiB in $DEST ($ignored)"
