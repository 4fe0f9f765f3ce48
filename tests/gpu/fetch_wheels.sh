#!/usr/bin/env bash
# Download the wheels of tests/gpu/wheels.txt into .whl/ (git-ignored), for the GPU machine,
# which has Python 3.12 on x86-64 Linux and no network. Run here, from anywhere:
#     bash tests/gpu/fetch_wheels.sh
# It replaces .whl/ as a whole, so it holds exactly one wheel per line of wheels.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
LIST=tests/gpu/wheels.txt
TMP=.whl.part
rm -rf "$TMP"
mkdir -p "$TMP"
PLATFORMS=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 \
           manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$TMP" -r "$LIST"
# Exactly one wheel per listed name (two versions of one package stop the install there).
want=$(grep -Ev '^\s*(#|$)' "$LIST" | wc -l)
have=$(ls "$TMP"/*.whl | wc -l)
if [ "$want" != "$have" ]; then
    echo "fetch_wheels.sh: $want packages listed but $have wheels downloaded" >&2
    ls "$TMP" >&2
    exit 1
fi
rm -rf .whl
mv "$TMP" .whl
du -sh .whl
