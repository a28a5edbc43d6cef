{
  "targets": [
    {
      "target_name": "effect_rl_kernels",
      "sources": ["units/core.cc", "units/elementwise.cc"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions"],
      "cflags_cc": ["-std=c++17", "-O3", "-fno-math-errno", "-fno-trapping-math", "<!@(sh ./detect-blas.sh cflags)"],
      "defines": ["NAPI_VERSION=8", "<!@(sh ./detect-blas.sh defines)"],
      "libraries": ["<!@(sh ./detect-blas.sh libraries)", "-lpthread"]
    }
  ]
}
