// node-llama-cpp's types where it is not installed. tsconfig.json's `paths` try the installed package's own types
// first (node_modules, then .llamacpp/ from `npm run setup:llamacpp`) and fall back to this file, so effect-rl
// type-checks and builds without it; the code that uses it (src/inference/LlamaCppPackage.ts and its callers) is
// checked against the real types where it is installed, as CI does.

// biome-ignore lint/suspicious/noExplicitAny: stands in for types that are not installed
export declare const getLlama: any
// biome-ignore lint/suspicious/noExplicitAny: stands in for types that are not installed
export declare const LlamaLogLevel: any
