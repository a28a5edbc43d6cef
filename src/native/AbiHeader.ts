/**
 * Renders native/abi.generated.h from the ABI table (src/native/Abi.ts): the C++ half of the table. For each function
 * F: `FArgs`, a struct with one field per argument; `unpack(Args&, FArgs*)`, which checks the argument count and reads
 * every field in the table's order; the declaration of the kernel `napi_value F(Args&, const FArgs&)` that one of
 * native/*.cc defines; and `kExports`, the name → entry point list that native/module.cc registers.
 * `node native/generate-abi.mjs` writes the file; test/native/Abi.test.ts compares it with `render()`.
 */
import * as Abi from "./Abi.ts"

export const path = "native/abi.generated.h"

/** `rmsNormGrad` → `RmsNormGrad`: the C++ kernel's name; its struct is `RmsNormGradArgs`. */
export const kernelName = (name: string): string => name.charAt(0).toUpperCase() + name.slice(1)

const cppType: Record<Abi.Kind, string> = {
  heap: "Heap",
  view: "View",
  string: "std::string",
  f32Buffer: "int64_t",
  "f32Buffer?": "int64_t",
  i32Buffer: "int64_t",
  byteBuffer: "int64_t",
  int32Array: "Int32s",
  "int32Array?": "Int32s",
  int: "int",
  i64: "int64_t",
  f32: "float",
  f64: "double",
  bool: "bool",
  i64x4: "int64_t"
}

const kindNote: Record<Abi.Kind, string> = {
  heap: "the wasm heap; null: absolute addresses",
  view: "a typed array or DataView",
  string: "",
  f32Buffer: "byte offset of float32 data",
  "f32Buffer?": "byte offset of float32 data; < 0: none",
  i32Buffer: "byte offset of int32 data",
  byteBuffer: "byte offset",
  int32Array: "Int32Array",
  "int32Array?": "Int32Array, or null (data == nullptr)",
  int: "",
  i64: "",
  f32: "",
  f64: "",
  bool: "",
  i64x4: ""
}

/** The reads of one field starting at JS argument `at`. */
const reads = (name: string, kind: Abi.Kind, at: number): Array<string> => {
  switch (kind) {
    case "heap":
      return [`in->${name} = args.heap(${at});`]
    case "view":
      return [`in->${name} = args.view(${at});`]
    case "string":
      return [`in->${name} = args.string(${at});`]
    case "int32Array":
      return [`in->${name} = args.int32s(${at});`]
    case "int32Array?":
      return [`in->${name} = args.isNullish(${at}) ? Int32s{} : args.int32s(${at});`]
    case "int":
      return [`in->${name} = (int)args.i64(${at});`]
    case "f32":
      return [`in->${name} = (float)args.num(${at});`]
    case "f64":
      return [`in->${name} = args.num(${at});`]
    case "bool":
      return [`in->${name} = args.flag(${at});`]
    case "i64x4":
      return [0, 1, 2, 3].map((k) => `in->${name}[${k}] = args.i64(${at + k});`)
    default:
      return [`in->${name} = args.i64(${at});`]
  }
}

/** `text` as `//` comment lines of at most `width` columns. */
const comment = (text: string, indent = "", width = 120): Array<string> => {
  const lines: Array<string> = []
  let line = ""
  for (const word of text.split(/\s+/)) {
    if (line !== "" && indent.length + 3 + line.length + 1 + word.length > width) {
      lines.push(`${indent}// ${line}`)
      line = word
    } else {
      line = line === "" ? word : `${line} ${word}`
    }
  }
  if (line !== "") lines.push(`${indent}// ${line}`)
  return lines
}

const renderFunction = (name: string, spec: Abi.FunctionSpec): Array<string> => {
  const kernel = kernelName(name)
  const struct = `${kernel}Args`
  const fields: Array<string> = []
  const body: Array<string> = []
  let at = 0
  for (const [field, kind, note] of spec.args) {
    const declarator = kind === "i64x4" ? `${field}[4]` : field
    const notes = [kindNote[kind], note ?? ""].filter((n) => n !== "").join("; ")
    fields.push(`  ${cppType[kind]} ${declarator};${notes === "" ? "" : `  // ${notes}`}`)
    body.push(...reads(field, kind, at).map((line) => `  ${line}`))
    at += kind === "i64x4" ? 4 : 1
  }
  return [
    ...comment(`${name}: ${spec.doc}`),
    fields.length === 0 ? `struct ${struct} {};` : `struct ${struct} {`,
    ...(fields.length === 0 ? [] : [...fields, "};"]),
    `napi_value ${kernel}(Args& args, const ${struct}& in);`,
    `inline bool unpack(Args& args, ${struct}* in) {`,
    ...(fields.length === 0 ? ["  (void)in;"] : []),
    `  if (!args.expectCount(${at}, "${name}")) return false;`,
    ...body,
    "  return args.ok;",
    "}",
    ""
  ]
}

/** The header's text for `functions` (by default the table), ending in a newline. */
export const render = (
  functions: Readonly<Record<string, Abi.FunctionSpec>> = Abi.functions,
  hash: string = Abi.hash
): string => {
  const names = Object.keys(functions)
  const lines = [
    "// Generated from src/native/Abi.ts by `node native/generate-abi.mjs` (install.mjs runs it too): do not edit.",
    "// Change the table, run that, rebuild (`node native/install.mjs`); test/native/Abi.test.ts fails while this is stale.",
    "//",
    "// Per exported function F: FArgs, its arguments by name; unpack(), which fills FArgs from the call in the table's",
    "// order and fails the call on a wrong argument count or type; and F, the kernel, defined in one of native/*.cc.",
    "#pragma once",
    "",
    '#include "napi_args.h"',
    "",
    "namespace effect_rl {",
    "",
    "// The table's hash (Abi.hash): info() reports it, and the loader refuses an addon built from another table.",
    `constexpr const char kAbiHash[] = "${hash}";`,
    "",
    ...names.flatMap((name) => renderFunction(name, functions[name]!)),
    "// The exported entry point of a kernel: read its arguments, then run it.",
    "template <typename In, napi_value (*Kernel)(Args&, const In&)>",
    "napi_value entry(napi_env env, napi_callback_info info) {",
    "  Args args(env, info);",
    "  In in;",
    "  if (!unpack(args, &in)) return nullptr;",
    "  return Kernel(args, in);",
    "}",
    "",
    "struct Export {",
    "  const char* name;",
    "  napi_callback callback;",
    "};",
    "",
    "constexpr Export kExports[] = {",
    ...names.map((name) => `    {"${name}", entry<${kernelName(name)}Args, ${kernelName(name)}>},`),
    "};",
    "",
    "}  // namespace effect_rl",
    ""
  ]
  return lines.join("\n")
}
