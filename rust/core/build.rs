//! Sets `srt_avx512` when the compiler has stable AVX-512 intrinsics (Rust 1.89), which the
//! quantized kernels' AVX-512 path needs; older compilers build the crate without that path.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(srt_avx512)");
    if rustversion::cfg!(since(1.89)) {
        println!("cargo::rustc-cfg=srt_avx512");
    }
}
