#!/usr/bin/env bash
# Install test: installs spyglass from a build dir into a fresh prefix, checks
# the installed files, then builds and runs a downstream program against the
# prefix, once through the CMake package (find_package(spyglass)) and once
# through pkg-config.
#
#   run_install_test.sh <build_dir> [<source_dir>]
set -euo pipefail

build_dir=$(cd "${1:?usage: $0 <build_dir> [<source_dir>]}" && pwd)
source_dir=$(cd "${2:-$(dirname "$0")/../..}" && pwd)
here="$source_dir/tests/install"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/spyglass-install.XXXXXX")
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT
prefix="$tmp/prefix"

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "--- $*"; }

# Nothing from the build tree or the environment may help the installed files
# find each other.
unset LD_LIBRARY_PATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH spyglass_DIR || true

step "install into $prefix"
cmake --install "$build_dir" --prefix "$prefix"

step "installed files"
[[ -f "$prefix/include/spyglass/profiler.h" ]] || fail "include/spyglass/profiler.h not installed"
[[ -f "$prefix/include/spyglass/annotation.h" ]] || fail "include/spyglass/annotation.h not installed"
[[ -f "$prefix/include/spyglass/internal/recorder.h" ]] || fail "include/spyglass/internal/recorder.h not installed"
compgen -G "$prefix/lib/libspyglass.so*" >/dev/null || fail "lib/libspyglass.so* not installed"
[[ -e "$prefix/lib/libspyglass.so" ]] || fail "lib/libspyglass.so (the link-time name) not installed"
[[ -f "$prefix/lib/cmake/spyglass/spyglassConfig.cmake" ]] || fail "lib/cmake/spyglass/spyglassConfig.cmake not installed"
[[ -f "$prefix/lib/cmake/spyglass/spyglassConfigVersion.cmake" ]] || fail "lib/cmake/spyglass/spyglassConfigVersion.cmake not installed"
[[ -f "$prefix/lib/pkgconfig/spyglass.pc" ]] || fail "lib/pkgconfig/spyglass.pc not installed"
[[ -x "$prefix/bin/spyglass" ]] || fail "bin/spyglass not installed"

step "bin/spyglass --version (no LD_LIBRARY_PATH: found through its RPATH)"
want_version=$(sed -nE 's/^project\(spyglass VERSION ([0-9][0-9.]*).*/\1/p' "$source_dir/CMakeLists.txt")
[[ -n "$want_version" ]] || fail "cannot read the project version from $source_dir/CMakeLists.txt"
got=$("$prefix/bin/spyglass" --version) || fail "bin/spyglass --version failed"
echo "$got"
[[ "$got" == *"$want_version"* ]] || fail "bin/spyglass --version printed '$got', want version $want_version"

step "CMake package: configure, build and run the downstream project"
cmake -S "$here/downstream" -B "$tmp/downstream-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo ${CMAKE_GENERATOR:+-G "$CMAKE_GENERATOR"}
cmake --build "$tmp/downstream-build"
found_dir=$(sed -n 's/^spyglass_DIR:PATH=//p' "$tmp/downstream-build/CMakeCache.txt")
[[ "$found_dir" == "$prefix/lib/cmake/spyglass" ]] || fail "find_package found spyglass in '$found_dir', not in the prefix"
# The build tree's RPATH (set by CMake from the imported target) finds the
# installed library: no LD_LIBRARY_PATH.
"$tmp/downstream-build/app" "$tmp/logs-cmake" || fail "downstream app (CMake package) failed"
compgen -G "$tmp/logs-cmake/plugins/profile/*/*.xplane.pb" >/dev/null \
  || fail "no plugins/profile/<run>/*.xplane.pb under $tmp/logs-cmake"

step "pkg-config: compile and run the downstream program"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
pkg-config --exists spyglass || fail "pkg-config does not find spyglass"
pc_version=$(pkg-config --modversion spyglass)
[[ "$pc_version" == "$want_version" ]] || fail "pkg-config --modversion is '$pc_version', want $want_version"
# shellcheck disable=SC2207
flags=($(pkg-config --cflags --libs spyglass))
echo "pkg-config --cflags --libs spyglass: ${flags[*]}"
"${CXX:-c++}" -o "$tmp/app-pc" "$here/downstream/main.cc" "${flags[@]}"
LD_LIBRARY_PATH="$prefix/lib" "$tmp/app-pc" "$tmp/logs-pc" || fail "downstream app (pkg-config) failed"
compgen -G "$tmp/logs-pc/plugins/profile/*/*.xplane.pb" >/dev/null \
  || fail "no plugins/profile/<run>/*.xplane.pb under $tmp/logs-pc"

echo "PASS: install test"
