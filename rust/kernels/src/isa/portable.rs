//! One portable body compiled for every tier above scalar that has no code of its own: the
//! compiler vectorizes the body's fixed-size loops for each tier's registers, so the tiers
//! differ only in the instructions it picks (and compute the same bits: the body fixes the
//! order of every sum).

/// Defines `$name(isa, args)`, which runs `$portable(args)` compiled for the features of tier
/// `isa` (AVX-512 or AVX2 with FMA; the portable code itself below them), or of the detected
/// tier if that is lower. Over an unsafe `$portable`, `$name` is unsafe and its callers keep
/// `$portable`'s promises. Every function it defines is generic over `T: Element`.
macro_rules! portable_tiers {
    ($vis:vis unsafe fn $name:ident($($arg:ident: $ty:ty),*) = $portable:path) => {
        $crate::isa::portable_tiers!(@define [unsafe] $vis $name($($arg: $ty),*) = $portable);
    };
    ($vis:vis fn $name:ident($($arg:ident: $ty:ty),*) = $portable:path) => {
        $crate::isa::portable_tiers!(@define [] $vis $name($($arg: $ty),*) = $portable);
    };
    (@define [$($unsafety:tt)?] $vis:vis $name:ident($($arg:ident: $ty:ty),*) = $portable:path) => {
        // The unsafe blocks are needed over an unsafe body only.
        #[allow(unused_unsafe)]
        $vis $($unsafety)? fn $name<T: $crate::element::Element>(
            isa: $crate::isa::Isa,
            $($arg: $ty),*
        ) {
            #[cfg(target_arch = "x86_64")]
            {
                use $crate::element::Element;
                use $crate::isa::{Avx2, Avx512};
                #[target_feature(enable = "avx2,fma")]
                $($unsafety)? fn avx2<T: Element>(_: Avx2, $($arg: $ty),*) {
                    // SAFETY: forwarded from the caller (nothing, over a safe body).
                    unsafe { $portable($($arg),*) }
                }
                #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
                $($unsafety)? fn avx512<T: Element>(_: Avx512, $($arg: $ty),*) {
                    // SAFETY: as above.
                    unsafe { $portable($($arg),*) }
                }
                if let Some(cpu) = Avx512::at_most(isa) {
                    // SAFETY: the token proves the CPU has the function's features; the rest
                    // is the caller's promise.
                    return unsafe { avx512(cpu, $($arg),*) };
                }
                if let Some(cpu) = Avx2::at_most(isa) {
                    // SAFETY: as above.
                    return unsafe { avx2(cpu, $($arg),*) };
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = isa;
            // SAFETY: forwarded from the caller (nothing, over a safe body).
            unsafe { $portable($($arg),*) }
        }
    };
}

pub(crate) use portable_tiers;
