#!/bin/sh
# A launcher as pyenv's shims and conda's wrappers are: it runs helper
# programs first (each a fork and an exec), then execs the program it
# launches, which keeps its pid.
name=$(basename "$1")
ls / >/dev/null
for i in 1 2; do echo "$name" | cat >/dev/null; done
# Subshells of subshells (forks without exec, their parent not the program).
version=$( (echo "$name" | (read -r v; echo "$v")) )
exec "$@"
