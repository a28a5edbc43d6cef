/**
 * The parts of tfjs-backend-wasm's BackendWasm that native kernels use, and the shape of a kernel that runs on it.
 * Tensors live in the wasm heap; a kernel passes the heap and its tensors' byte offsets to the addon. The heap can
 * grow on any allocation, which detaches the old ArrayBuffer, so every kernel takes `HEAPU8` after it has allocated
 * its outputs. The `native` backend (tensors in JS memory, see JsMemory.ts) presents the same surface with a null
 * heap and absolute addresses as offsets.
 */
import type * as tf from "../tensor/Tf.ts"
import type * as Abi from "./Abi.ts"

export interface WasmBackend {
  readonly wasm: { readonly HEAPU8: Uint8Array | null }
  readonly dataIdMap: { get(dataId: object): { memoryOffset: number } }
  /**
   * The address of a float32 tensor stored as bfloat16 bits (the native backend's frozen weights), or undefined for
   * any other tensor. Kernels that read bfloat16 ask this first; `dataIdMap.get` widens such a tensor to float32 in
   * place, for every kernel that does not.
   */
  readonly bf16Offset?: (dataId: object) => number | undefined
  makeOutput(shape: Array<number>, dtype: tf.DataType): tf.TensorInfo
  incRef(dataId: object): void
  disposeData(dataId: object): boolean
}

/** What tfjs passes a kernel function on the wasm backend. */
export interface KernelArgs {
  readonly inputs: tf.NamedTensorInfoMap
  readonly backend: WasmBackend
  readonly attrs: tf.NamedAttrMap
}

/** Byte offset of a tensor's data in the heap. */
export const offsetOf = (backend: WasmBackend, t: tf.TensorInfo): number => backend.dataIdMap.get(t.dataId).memoryOffset

/** Byte offset, or −1 for an absent tensor (the ABI's `f32Buffer?`). */
export const optionalOffset = (backend: WasmBackend, t: tf.TensorInfo | undefined): number =>
  t === undefined ? -1 : offsetOf(backend, t)

/** A native kernel that may decline: `undefined` hands the call to the stock kernel it replaced. */
export type NativeKernel = (kernels: Abi.Kernels, args: KernelArgs) => tf.TensorInfo | Array<tf.TensorInfo> | undefined

/** A kernel with no stock counterpart: it always runs. */
export type OwnKernel = (kernels: Abi.Kernels, args: KernelArgs) => tf.TensorInfo | Array<tf.TensorInfo>
