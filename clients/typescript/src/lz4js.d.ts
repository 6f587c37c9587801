// lz4js ships no types: the one function used.
declare module "lz4js" {
  export function decompress(src: Uint8Array, maxSize?: number): Uint8Array;
}
