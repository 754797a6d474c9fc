//! Which instruction set the CPU kernels run: the best this CPU and its OS offer (CPUID and
//! XGETBV, the checks `is_x86_feature_detected!` makes), capped by a ceiling that the process
//! may lower (`SRT_CPU_ISA`, set once through the binding) so that the slower paths of every
//! kernel can be run and tested on a machine that has the faster ones.
//!
//! What must stay true: a kernel never runs a tier above [`detected`]; [`active`] is never
//! above it, whatever the ceiling says.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use crate::{Error, Result};

/// A tier of the kernels' instruction sets, each including the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Isa {
    /// Portable Rust, whatever the compiler's baseline target is.
    Scalar = 0,
    /// x86-64 with AVX2 and FMA.
    Avx2 = 1,
    /// AVX2 plus AVX-512 F and BW.
    Avx512 = 2,
    /// AVX-512 plus AVX-512 BF16 (`vdpbf16ps`: bf16 pairs multiplied into float32 sums).
    Avx512Bf16 = 3,
}

impl Isa {
    /// Every tier, lowest first.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16];

    /// The tier's name, as `SRT_CPU_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512_bf16",
        }
    }

    /// The tier named `name` (one of [`Isa::name`]'s).
    pub fn parse(name: &str) -> Result<Isa> {
        Isa::ALL
            .into_iter()
            .find(|isa| isa.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Isa::ALL.iter().map(|isa| isa.name()).collect();
                Error::InvalidArgument(format!(
                    "unknown CPU instruction set {name:?} (known: {})",
                    names.join(", ")
                ))
            })
    }

    fn from_u8(value: u8) -> Isa {
        Isa::ALL[usize::from(value).min(Isa::ALL.len() - 1)]
    }
}

/// The highest tier this CPU and OS run, found once.
pub fn detected() -> Isa {
    static DETECTED: OnceLock<Isa> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    use std::arch::is_x86_feature_detected as has;
    if !(has!("avx2") && has!("fma")) {
        Isa::Scalar
    } else if !(has!("avx512f") && has!("avx512bw")) {
        Isa::Avx2
    } else if !has!("avx512bf16") {
        Isa::Avx512
    } else {
        Isa::Avx512Bf16
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Isa {
    Isa::Scalar
}

static CEILING: AtomicU8 = AtomicU8::new(Isa::Avx512Bf16 as u8);

/// Caps the tier the kernels run at `ceiling` (for tests and to compare paths; the default
/// is no cap). Calls running concurrently may still use the previous tier.
pub fn set_ceiling(ceiling: Isa) {
    CEILING.store(ceiling as u8, Ordering::Relaxed);
}

/// The tier the kernels run now: the detected one, capped by the ceiling.
pub fn active() -> Isa {
    detected().min(Isa::from_u8(CEILING.load(Ordering::Relaxed)))
}

/// Whether the CPU has AMX tiles with bf16 products and the OS saves their state (CPUID leaf 7
/// EDX bit 22, XCR0 bits 17 and 18). Not a kernel tier (srt runs no AMX code: PyTorch's oneDNN
/// does); it tells whether bf16 matrix products run natively. Read from CPUID directly because
/// `is_x86_feature_detected!("amx-bf16")` is not stable Rust.
pub fn amx_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        const OSXSAVE: u32 = 1 << 27;
        const AMX_BF16: u32 = 1 << 22;
        const TILE_STATE: u64 = 0b11 << 17;
        if __cpuid(1).ecx & OSXSAVE == 0 || __cpuid(0).eax < 7 {
            return false;
        }
        if __cpuid_count(7, 0).edx & AMX_BF16 == 0 {
            return false;
        }
        // SAFETY: OSXSAVE is set, so the CPU has XGETBV and the OS enabled it.
        unsafe { xcr0() & TILE_STATE == TILE_STATE }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    std::arch::x86_64::_xgetbv(0)
}

/// Whether bf16 matrix products run natively here (AVX-512 BF16 or AMX-BF16), within the
/// ceiling: capped below `Avx512Bf16`, the process behaves as a CPU without them.
pub fn native_bf16_matmul() -> bool {
    let capped = active() < detected();
    !capped && (detected() == Isa::Avx512Bf16 || amx_bf16())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for isa in Isa::ALL {
            assert_eq!(Isa::parse(isa.name()), Ok(isa));
        }
        assert!(matches!(
            Isa::parse("avx1024"),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(Isa::from_u8(200), Isa::Avx512Bf16);
    }

    #[test]
    fn tiers_are_ordered_and_the_active_one_never_exceeds_the_cpu() {
        assert!(Isa::ALL.windows(2).all(|pair| pair[0] < pair[1]));
        assert!(active() <= detected());
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512bf16") {
            assert_eq!(detected(), Isa::Avx512Bf16);
        }
    }
}
