#!/usr/bin/env bash
# test_install.sh -- gpumem as its users get it: `cmake --install` into a fresh prefix, then a C program
# built against it through pkg-config and through find_package(gpumem), and the Python package
# pip-installed from the prefix (offline) and imported outside the repository, finding the installed
# library by itself. Stops at the first failure, saying what failed.
# Usage: test_install.sh BUILD_DIRECTORY SOURCE_DIRECTORY PYTHON
# (CMAKE and CC in the environment name the cmake and C compiler to use; default cmake and cc.)
set -u
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
python=$3
cmake=${CMAKE:-cmake}
cc=${CC:-cc}
work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
prefix=$work/prefix
unset GPUMEM_LIBRARY GPUMEM_CONF

# step DESCRIPTION -- COMMAND...: run COMMAND (from $work, its output kept in $work/out); if it fails,
# show its output and stop.
step() { run_step "$work/out" "$@"; }
# check DESCRIPTION -- COMMAND...: as step, for a test of the last step's output ($work/out stays).
check() { run_step "$work/check.out" "$@"; }
run_step() {
    local output=$1 description=$2
    shift 3
    if (cd "$work" && "$@") >"$output.new" 2>&1; then
        echo "ok   $description"
        mv "$output.new" "$output"
    else
        echo "FAIL: $description (exit $?): $*"
        sed 's/^/    /' "$output.new" | tail -40
        exit 1
    fi
}
show() { sed 's/^/         /' "$work/out"; }

step "cmake --install into a fresh prefix" -- "$cmake" --install "$build" --prefix "$prefix"

library=$(find "$prefix" -name libgpumem.so | head -1)
[ -n "$library" ] || { echo "FAIL: no libgpumem.so under $prefix:"; find "$prefix" | sed 's/^/    /'; exit 1; }
libdir=$(dirname "$library")
for file in bin/gpumem include/gpumem.h "${libdir#"$prefix"/}"/libgpumem.so.0 \
            "${libdir#"$prefix"/}"/pkgconfig/gpumem.pc "${libdir#"$prefix"/}"/cmake/gpumem/gpumemConfig.cmake \
            "${libdir#"$prefix"/}"/cmake/gpumem/gpumemConfigVersion.cmake \
            "${libdir#"$prefix"/}"/cmake/gpumem/gpumemTargets.cmake \
            share/gpumem/python/pyproject.toml share/gpumem/python/gpumem/__init__.py \
            share/gpumem/python/gpumem/_install_paths.py share/gpumem/python/sitecustomize.py; do
    check "installed $file" -- test -e "$prefix/$file"
done
check "no static library installed" -- test -z "$(find "$prefix" -name '*.a')"

step "bin/gpumem version" -- "$prefix/bin/gpumem" version
version=$(sed -n 's/^gpumem //p' "$work/out")
show
step "readelf -d libgpumem.so" -- readelf -d "$library"
check "its SONAME is libgpumem.so.0" -- grep -q 'Library soname: \[libgpumem.so.0\]' "$work/out"
step "ldd libgpumem.so" -- ldd "$library"
check "it does not need zlib" -- bash -c "! grep -q libz '$work/out'"

# pkg-config: the flags it gives build a program that runs on the installed library.
export PKG_CONFIG_PATH=$libdir/pkgconfig
check "pkg-config is there (CI installs it)" -- command -v pkg-config
step "pkg-config --modversion gpumem" -- pkg-config --modversion gpumem
check "pkg-config version $(cat "$work/out") is gpumem version $version" -- test "$(cat "$work/out")" = "$version"
step "pkg-config --cflags --libs gpumem" -- pkg-config --cflags --libs gpumem
flags=$(cat "$work/out")
show
check "pkg-config points into the prefix" -- grep -qF -- "-L$libdir " "$work/out"
# shellcheck disable=SC2086  # the flags are words
step "cc consumer.c \$(pkg-config --cflags --libs gpumem)" -- \
    "$cc" "$source/tests/install/consumer.c" $flags -o "$work/consumer-pkg-config"
step "consumer (pkg-config) runs with LD_LIBRARY_PATH=$libdir" -- \
    env LD_LIBRARY_PATH="$libdir" "$work/consumer-pkg-config"
show
step "ldd consumer (pkg-config)" -- env LD_LIBRARY_PATH="$libdir" ldd "$work/consumer-pkg-config"
check "it loaded the installed library" -- grep -qF "$libdir/libgpumem.so.0" "$work/out"
unset PKG_CONFIG_PATH

# find_package(gpumem CONFIG): the imported target gpumem::gpumem; the program runs through its build RPATH.
step "configure tests/install with find_package(gpumem) and CMAKE_PREFIX_PATH=$prefix" -- \
    "$cmake" -S "$source/tests/install" -B "$work/consumer-cmake" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_COMPILER="$cc"
check "gpumem_DIR is the prefix's package" -- \
    grep -qF "gpumem_DIR:PATH=$libdir/cmake/gpumem" "$work/consumer-cmake/CMakeCache.txt"
step "build the find_package consumer" -- "$cmake" --build "$work/consumer-cmake"
step "consumer (find_package) runs without LD_LIBRARY_PATH" -- env -u LD_LIBRARY_PATH "$work/consumer-cmake/consumer"
show

# The PyTorch hook (torch itself is not needed): with GPUMEM_TORCH set, the sitecustomize beside the
# package puts its finder first on sys.meta_path, so that importing torch installs gpumem.
hook_probe='import os, sys, sitecustomize
assert os.path.realpath(sitecustomize.__file__).startswith(os.path.realpath(sys.argv[1]) + os.sep), sitecustomize.__file__
assert type(sys.meta_path[0]).__name__ == "_InstallAfterTorch", sys.meta_path
print("hooked from", sitecustomize.__file__)'
step "bin/gpumem run hooks PyTorch from the prefix" -- \
    env -u PYTHONPATH "$prefix/bin/gpumem" run -- "$python" -c "$hook_probe" "$prefix/share/gpumem/python"
show

# The Python package, pip-installed offline from the prefix (the source folder left read-only: pip must not
# need to write there), then imported from elsewhere without GPUMEM_LIBRARY: it uses the installed library.
chmod -R a-w "$prefix/share/gpumem/python"
pip_install=("$python" -m pip install --no-build-isolation --no-index --target "$work/site" "$prefix/share/gpumem/python")
step "${pip_install[*]}" -- "${pip_install[@]}"
check "pip left the installed sources as they were" -- \
    test -z "$(find "$prefix/share/gpumem/python" -name build -o -name '*.egg-info')"
step "import the pip-installed package outside the repository (with $python)" -- \
    env PYTHONPATH="$work/site" "$python" -c '
import importlib.metadata, os, sys
prefix, site, version = sys.argv[1:]
import gpumem
assert gpumem.__file__.startswith(site + os.sep), gpumem.__file__
assert gpumem.library_path().startswith(prefix + os.sep), "library " + gpumem.library_path()
assert gpumem.include_path() == os.path.join(prefix, "include"), "include " + str(gpumem.include_path())
assert gpumem.__version__ == version == importlib.metadata.version("gpumem"), (gpumem.__version__, version)
with gpumem.Allocator("backend:sim,capacity:1GiB", from_environment=False) as allocator:
    allocator.free(allocator.malloc(3 << 20))
    assert allocator.memory_stats()["allocated_bytes.all.peak"] == 3 << 20
    print("library", gpumem.library_path())
    print(allocator.summary().splitlines()[1])
import gpumem.torch  # importable without torch
' "$prefix" "$work/site" "$version"
show
step "GPUMEM_TORCH=1 with the pip-installed package on PYTHONPATH hooks PyTorch" -- \
    env PYTHONPATH="$work/site" GPUMEM_TORCH=1 "$python" -c "$hook_probe" "$work/site"
show
echo "test_install: all passed"
