#!/usr/bin/env bash
# Annotation names: literals, static arrays and copied names compile; a const
# char array with automatic storage (stack, struct member) does not, because
# its pointer would be read after the storage is reused.
# Usage: check_annotation_names.sh CXX INCLUDE_DIR
set -uo pipefail
cxx=$1 inc=$2
src=$(dirname "$0")/annotation_names.cc
if ! "$cxx" -std=c++20 -fsyntax-only -I "$inc" "$src"; then
  echo "FAIL: the good names do not compile"; exit 1
fi
for bad in BAD_CONST_STACK_ARRAY BAD_CONST_MEMBER BAD_STEP_CONST_STACK_ARRAY; do
  out=$("$cxx" -std=c++20 -fsyntax-only -I "$inc" -D"$bad" "$src" 2>&1)
  if [ $? -eq 0 ]; then echo "FAIL: $bad compiled"; exit 1; fi
  if ! grep -q "not a constant expression\|not usable in a constant expression\|StaticName" <<<"$out"; then
    echo "FAIL: $bad failed for another reason:"; echo "$out" | head -20; exit 1
  fi
  echo "ok: $bad is rejected"
done
