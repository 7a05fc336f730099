#!/usr/bin/env bash
# libspyglass.so exports its public API only (include/spyglass/*.h): every
# other symbol (generated protobuf/gRPC code, server, model, exporters,
# session, the standard library's instantiations) is hidden, not ABI.
# Usage: exported_symbols_test.sh <libspyglass.so.0>
set -euo pipefail
lib=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v nm >/dev/null || fail "nm (binutils) not found"

# Defined dynamic symbols, demangled, without address and type.
syms=$(nm -D --defined-only -C "$lib" | sed -E 's/^[0-9a-f]* *[A-Za-z] //')
count=$(printf '%s\n' "$syms" | grep -c .) || true
echo "$lib: $count exported symbols"

# The allowed names, one pattern each (extended regex on the demangled name).
allowed=(
  '^spyglass::profiler::'                       # profiler.h, server.h, options.h
  '^spyglass::Status::'                         # status.h
  '^spyglass::StatusCodeName\('
  '^spyglass::version\(\)$'
  '^spyglass::profile::'                        # profile_reader.h
  '^(typeinfo|vtable) (name )?for spyglass::profile::ProfileVisitor$'
  # What the inline hot path (spyglass/internal/recorder.h) calls or reads:
  '^spyglass::internal::g_state$'
  '^spyglass::internal::t_slot$'
  '^spyglass::internal::bind_slow\('
  '^spyglass::internal::grow_slow\('
  '^spyglass::internal::add_arg\('
  '^spyglass::internal::step_was_slow\(\)$'
)
pattern=$(IFS='|'; echo "${allowed[*]}")
extra=$(printf '%s\n' "$syms" | grep -Ev "$pattern" || true)
if [[ -n "$extra" ]]; then
  printf '%s\n' "$extra" | head -n 40 >&2 || true
  fail "$(printf '%s\n' "$extra" | grep -c .) exported symbols are not public API (first 40 above)"
fi

# Named explicitly too, so that a loosened pattern above is noticed.
forbidden='google::protobuf|grpc|tensorflow::|spyglass::(server|model|exporter|session|export|trace|sinks)::|absl::'
# (here-strings, not `printf | grep -q`: grep -q exits at the first match, and
# under pipefail printf's SIGPIPE would fail the pipeline at random)
if grep -Eq "$forbidden" <<<"$syms"; then
  fail "internal symbols exported: $(printf '%s\n' "$syms" | grep -E "$forbidden" | head -n 5 || true)"
fi

# And the public API is there: a downstream program needs these.
for need in 'spyglass::profiler::start_trace(' 'spyglass::profiler::stop_trace()' \
            'spyglass::profiler::start_server(' 'spyglass::internal::g_state' 'spyglass::internal::t_slot' \
            'spyglass::internal::bind_slow(' 'spyglass::internal::add_arg(' 'spyglass::Status::ToString' \
            'spyglass::version()' 'spyglass::profile::ProfileReader::Open(' \
            'spyglass::profile::ProfileReader::Scan(' 'spyglass::profile::ProfileData::plane(' \
            'typeinfo for spyglass::profile::ProfileVisitor' 'vtable for spyglass::profile::ProfileVisitor'; do
  grep -qF -- "$need" <<<"$syms" || fail "public symbol missing: $need"
done
echo "OK: only the public API is exported"
