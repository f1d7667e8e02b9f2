#!/usr/bin/env bash
# What a framework that links libcomm sees: install the build into a staging
# root (as a package build does, DESTDIR=ROOT meson install), then
#  - compile every installed header on its own: the C header as C11 with
#    -Wall -Werror (and as C++), every C++ header as C++20;
#  - build a C program with nothing but `cc $(pkg-config --cflags --libs
#    comm)` and run it.
# Usage: install_test.sh BUILD_DIR
set -euo pipefail

build_dir="$(cd "$1" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root="$work/root"

DESTDIR="$root" meson install -C "$build_dir" --no-rebuild --quiet >/dev/null

pc_file="$(find "$root" -name comm.pc -print -quit)"
[[ -n "$pc_file" ]] || { echo "install_test: no comm.pc was installed" >&2; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc_file")"
export PKG_CONFIG_SYSROOT_DIR="$root"
cflags="$(pkg-config --cflags comm)"
libs="$(pkg-config --libs comm)"
include_dir="${cflags#-I}"
include_dir="${include_dir%% *}"
lib_dir="${libs#-L}"
lib_dir="${lib_dir%% *}"

headers=()
while IFS= read -r header; do headers+=("${header#"$include_dir"/}"); done \
  < <(find "$include_dir" -name '*.h' | sort)
((${#headers[@]} > 0)) || { echo "install_test: no headers installed" >&2; exit 1; }

compile_alone() {  # HEADER: compiles a file that includes only HEADER
  local header="$1" source="$work/alone_${1//\//_}"
  if [[ "$header" == comm/* ]]; then
    printf '#include <%s>\n#include <%s>\n' "$header" "$header" > "$source.c"
    cc -std=c11 -Wall -Wextra -Werror -fsyntax-only $cflags "$source.c"
    cp "$source.c" "$source.cc"
    c++ -std=c++20 -Wall -Wextra -Werror -fsyntax-only $cflags "$source.cc"
  else
    printf '#include <%s>\n#include <%s>\n' "$header" "$header" > "$source.cc"
    c++ -std=c++20 -Wall -Wextra -Werror -fsyntax-only $cflags \
      -I/usr/local/cuda/include "$source.cc"
  fi
}
export -f compile_alone
export work cflags
printf '%s\n' "${headers[@]}" |
  xargs -P "$(nproc)" -I{} bash -c 'compile_alone "$1" || { echo "install_test: <$1> does not compile on its own" >&2; exit 255; }' _ {}
echo "install_test: ${#headers[@]} installed headers compile on their own"

cat > "$work/x.c" <<'PROGRAM'
#include <comm/comm.h>
#include <stdio.h>

int main(void) {
  comm_store_t store;
  comm_group_t group;
  double data[3] = {1.5, 2.5, 3.5};
  if (comm_store_create_hash(COMM_DEFAULT_TIMEOUT, &store) != COMM_SUCCESS ||
      comm_group_create(store, 0, 1, "tcp", 10000, &group) != COMM_SUCCESS ||
      comm_all_reduce(data, data, 3, COMM_FLOAT64, COMM_SUM, group, COMM_CPU,
                      NULL, NULL) != COMM_SUCCESS) {
    fprintf(stderr, "x: %s\n", comm_last_error());
    return 1;
  }
  comm_group_free(group);
  comm_store_free(store);
  printf("libcomm %d: %g %g %g\n", comm_version(), data[0], data[1], data[2]);
  return data[2] == 3.5 ? 0 : 1;
}
PROGRAM
# Exactly the line a user types, with the staging root standing in for /.
cc -std=c11 -Wall -Werror "$work/x.c" $(pkg-config --cflags --libs comm) -o "$work/x"
LD_LIBRARY_PATH="$lib_dir" "$work/x"
