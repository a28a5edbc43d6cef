#!/bin/sh
# Prints gyp settings (cflags: -march=native when accepted) and for BLAS: "-lopenblas" (libraries) / "EFFECT_RL_OPENBLAS=1" (defines) when libopenblas links on this
# machine, nothing otherwise (the addon then uses its own blocked SGEMM). Run by binding.gyp at configure time.
what="$1"
cc="${CC:-cc}"
tmp="${TMPDIR:-/tmp}/effect-rl-blas-$$"
printf 'void cblas_sgemm(void);\nint main(void){cblas_sgemm();return 0;}\n' > "$tmp.c"
# EFFECT_RL_NO_BLAS=1 forces the built-in SGEMM (to test it, or where OpenBLAS misbehaves).
if [ "${EFFECT_RL_NO_BLAS:-0}" != "1" ] && "$cc" "$tmp.c" -o "$tmp.out" -lopenblas >/dev/null 2>&1; then
  case "$what" in
    libraries) echo "-lopenblas" ;;
    defines) echo "EFFECT_RL_OPENBLAS=1" ;;
  esac
else
  case "$what" in
    defines) echo "EFFECT_RL_NO_BLAS=1" ;;
  esac
fi
if [ "$what" = "cflags" ]; then
  # Built at install time on the machine that runs it, so tune for its CPU (AVX2/AVX-512 FMA) when the compiler can.
  # EFFECT_RL_MARCH=<gcc -march value> targets another CPU instead: x86-64-v3 is what an AVX2-only machine (no
  # AVX-512) runs, so its kernels can be built, tested and benched on a machine that has AVX-512 (bench/kernels.ts).
  march="${EFFECT_RL_MARCH:-native}"
  if "$cc" -march="$march" "$tmp.c" -c -o "$tmp.o" >/dev/null 2>&1; then echo "-march=$march"; fi
fi
rm -f "$tmp.c" "$tmp.out" "$tmp.o"
