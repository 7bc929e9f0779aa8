#!/usr/bin/env bash
# Checks for the Debian packages that the build, the tests, the fuzzers and the
# quick start need, and installs the missing ones when run as root (as CI does); otherwise
# prints the one command to run. `make test` and `make quickstart` call it.
set -euo pipefail
missing=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
for pkg in gcc make xz-utils libpcre2-dev npm python3-torch python3-numpy python3-matplotlib; do
    have_pkg "$pkg" || missing+=("$pkg")
done
# node/npm may come from outside Debian's packages (as on these machines): accept a working npm
if command -v npm >/dev/null 2>&1; then missing=("${missing[@]/npm}"); fi
# make test's sanitizer build (gcc's ASan and UBSan runtimes, from gcc's own dependencies) and the
# fuzzers (clang with libFuzzer: Debian's libclang-rt-dev): checked by linking, whatever provides them
probe='int main(void) { return 0; }'
echo "$probe" | gcc -fsanitize=address,undefined -x c - -o /dev/null >/dev/null 2>&1 || missing+=(gcc)
fuzz_probe='#include <stdint.h>
#include <stddef.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }'
if ! echo "$fuzz_probe" | clang -fsanitize=fuzzer,address,undefined -x c - -o /dev/null >/dev/null 2>&1; then
    command -v clang >/dev/null 2>&1 || missing+=(clang)
    missing+=(libclang-rt-dev)
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "install_deps: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if ! echo "$fuzz_probe" | clang -fsanitize=fuzzer,address,undefined -x c - -o /dev/null >/dev/null 2>&1; then
        echo "error: clang -fsanitize=fuzzer still does not link after installing ${missing[*]}; fix: install the libclang-rt-N-dev of your clang-N" >&2
        exit 1
    fi
else
    echo "error: missing Debian packages: ${missing[*]}; fix: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
