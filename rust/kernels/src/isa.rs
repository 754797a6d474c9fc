//! What the CPU kernels may run: one capability model for every kernel.
//!
//! The CPU's features are detected once (CPUID and XGETBV, the checks `is_x86_feature_detected!`
//! makes: an instruction set counts only when the OS also saves its registers) and ordered into
//! tiers, each including the ones below it. A ceiling that the process may lower
//! (`SRT_CPU_ISA`, set once through the binding) caps the tier the kernels run, so that the
//! slower paths of every kernel can be run and tested on a machine that has the faster ones.
//!
//! AVX-VNNI (`vpdpbusd` on 256-bit vectors: Intel from Alder Lake and Sapphire Rapids on, AMD
//! from Zen 5) is detected beside the tiers, not as one: CPUs with AVX-512 may lack it (Skylake-X
//! to Ice Lake, Zen 4). The ceiling counts it in where its name says a CPU that has it
//! (`avx2_vnni`, as on Alder Lake, and `avx512_vnni` and above), and out below them, so that
//! `avx2` and `avx512` cap a CPU that has it to one that does not.
//!
//! Each tier above `Scalar` has a token: a zero-sized value that only this module makes, and
//! only when detection proved the tier's features. Every function compiled with
//! `#[target_feature]` takes the token of a tier whose features include the ones it enables
//! (a test reads the sources to hold every such function to that), so a call into a tier's code
//! from a path that has not proved the tier does not compile: the proof travels with the call.
//!
//! AMX-BF16 (tiles of bf16 products: Intel from Sapphire Rapids on) is beside the tiers too, on
//! a CPU of the top tier: it counts within the ceiling only at that tier (no cap, or
//! `avx512_bf16`), so that any cap turns it off. Linux hands a process the tiles' state only
//! when asked (`arch_prctl(ARCH_REQ_XCOMP_PERM)`); detection asks, and srt's kernels count AMX
//! only when granted, as a tile instruction run without that permission stops the process.
//!
//! What must stay true: a token exists only for a tier at most [`detected`]; [`active`] is
//! never above it, whatever the ceiling says.
//!
//! A lower tier's token does not prove a higher one:
//! ```compile_fail
//! fn wide(_: srt_kernels::isa::Avx512) {}
//! if let Some(cpu) = srt_kernels::isa::Avx2::detected() {
//!     wide(cpu.into());
//! }
//! ```
//! and nothing outside detection makes a token:
//! ```compile_fail
//! let cpu = srt_kernels::isa::Avx512(());
//! ```

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use crate::{Error, Result};

mod portable;

pub(crate) use portable::portable_tiers;

/// A tier of the kernels' instruction sets, each including the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Isa {
    /// Portable Rust, whatever the compiler's baseline target is.
    Scalar = 0,
    /// x86-64 with AVX2, FMA and F16C (every CPU with AVX2 has the other two).
    Avx2 = 1,
    /// AVX2 plus AVX-512 F and BW.
    Avx512 = 2,
    /// AVX-512 plus VNNI (`vpdpbusd`: bytes multiplied into int32 sums).
    Avx512Vnni = 3,
    /// AVX-512 VNNI plus AVX-512 BF16 (`vdpbf16ps`: bf16 pairs multiplied into float32 sums;
    /// every CPU with it has VNNI).
    Avx512Bf16 = 4,
}

impl Isa {
    /// Every tier, lowest first.
    pub const ALL: [Isa; 5] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Avx512Vnni,
        Isa::Avx512Bf16,
    ];

    /// The tier's name, as `SRT_CPU_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512_vnni",
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

/// What detection found, once per process.
struct Cpu {
    tier: Isa,
    /// AVX-VNNI, on a CPU of the AVX2 tier or above.
    avx_vnni: bool,
    /// AMX tiles with bf16 products, their state saved by the OS: whether PyTorch's oneDNN
    /// multiplies bf16 matrices natively.
    amx_bf16: bool,
    /// AMX-BF16 on a CPU of the top tier, the tiles' state granted to this process: what
    /// srt's own tile kernels need.
    amx_tiles: bool,
}

fn cpu() -> &'static Cpu {
    static CPU: OnceLock<Cpu> = OnceLock::new();
    CPU.get_or_init(|| {
        let tier = detect_tier();
        let amx_bf16 = detect_amx_bf16();
        Cpu {
            tier,
            avx_vnni: tier >= Isa::Avx2 && detect_avx_vnni(),
            amx_bf16,
            amx_tiles: amx_bf16 && tier == Isa::Avx512Bf16 && amx_granted(),
        }
    })
}

/// The highest tier this CPU and OS run.
pub fn detected() -> Isa {
    cpu().tier
}

#[cfg(target_arch = "x86_64")]
fn detect_tier() -> Isa {
    use std::arch::is_x86_feature_detected as has;
    let tiers = [
        (Isa::Avx2, has!("avx2") && has!("fma") && has!("f16c")),
        (Isa::Avx512, has!("avx512f") && has!("avx512bw")),
        (Isa::Avx512Vnni, has!("avx512vnni")),
        (Isa::Avx512Bf16, has!("avx512bf16")),
    ];
    tiers
        .into_iter()
        .take_while(|&(_, present)| present)
        .last()
        .map_or(Isa::Scalar, |(tier, _)| tier)
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_tier() -> Isa {
    Isa::Scalar
}

#[cfg(target_arch = "x86_64")]
fn detect_avx_vnni() -> bool {
    std::arch::is_x86_feature_detected!("avxvnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_avx_vnni() -> bool {
    false
}

/// CPUID leaf 7 EDX bit 22 and XCR0 bits 17 and 18. Read from CPUID directly because
/// `is_x86_feature_detected!("amx-bf16")` is not stable Rust.
#[cfg(target_arch = "x86_64")]
fn detect_amx_bf16() -> bool {
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
fn detect_amx_bf16() -> bool {
    false
}

/// Asks Linux for the tiles' state (`ARCH_REQ_XCOMP_PERM` for `XFEATURE_XTILEDATA`): whether
/// this process may run AMX instructions. Granted once, it holds for every thread.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_granted() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a system call that only changes which register state the kernel saves for this
    // process; it reads and writes no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn amx_granted() -> bool {
    false
}

/// Detection's own instruction: the one `#[target_feature]` function that takes no token.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    std::arch::x86_64::_xgetbv(0)
}

/// What the kernels may use: a tier, and whether AVX-VNNI counts within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ceiling {
    /// The highest tier.
    pub tier: Isa,
    /// Whether AVX-VNNI may run (where the CPU has it).
    pub avx_vnni: bool,
}

impl Ceiling {
    /// Every ceiling's name, as `SRT_CPU_ISA` spells it, lowest first: the tiers' and
    /// `avx2_vnni` (the AVX2 tier with AVX-VNNI).
    pub const NAMES: [&'static str; 6] = [
        "scalar",
        "avx2",
        "avx2_vnni",
        "avx512",
        "avx512_vnni",
        "avx512_bf16",
    ];

    /// The ceiling named `name` (one of [`Ceiling::NAMES`]): a tier's name caps at that tier,
    /// with AVX-VNNI from `avx512_vnni` up; `avx2_vnni` is the AVX2 tier with AVX-VNNI.
    pub fn parse(name: &str) -> Result<Ceiling> {
        if name == "avx2_vnni" {
            return Ok(Ceiling {
                tier: Isa::Avx2,
                avx_vnni: true,
            });
        }
        let tier = Isa::parse(name).map_err(|_| {
            Error::InvalidArgument(format!(
                "unknown CPU instruction set {name:?} (known: {})",
                Ceiling::NAMES.join(", ")
            ))
        })?;
        Ok(Ceiling {
            tier,
            avx_vnni: tier >= Isa::Avx512Vnni,
        })
    }
}

/// The ceiling's tier, with `AVX_VNNI_ALLOWED` set when AVX-VNNI counts within it.
static CEILING: AtomicU8 = AtomicU8::new(Isa::Avx512Bf16 as u8 | AVX_VNNI_ALLOWED);
const AVX_VNNI_ALLOWED: u8 = 0x80;

/// Caps what the kernels run at `ceiling` (for tests and to compare paths; the default is no
/// cap). Calls running concurrently may still use the previous one.
pub fn set_ceiling(ceiling: Ceiling) {
    let flag = if ceiling.avx_vnni {
        AVX_VNNI_ALLOWED
    } else {
        0
    };
    CEILING.store(ceiling.tier as u8 | flag, Ordering::Relaxed);
}

/// The ceiling now.
pub fn ceiling() -> Ceiling {
    let code = CEILING.load(Ordering::Relaxed);
    Ceiling {
        tier: Isa::from_u8(code & !AVX_VNNI_ALLOWED),
        avx_vnni: code & AVX_VNNI_ALLOWED != 0,
    }
}

/// The tier the kernels run now: the detected one, capped by the ceiling.
pub fn active() -> Isa {
    detected().min(ceiling().tier)
}

/// Whether the CPU has AMX tiles with bf16 products and the OS saves their state.
pub fn amx_bf16() -> bool {
    cpu().amx_bf16
}

/// Whether bf16 matrix products run natively here (AVX-512 BF16 or AMX-BF16), within the
/// ceiling: capped below the detected tier, the process behaves as a CPU without them.
pub fn native_bf16_matmul() -> bool {
    let capped = active() < detected();
    !capped && (detected() == Isa::Avx512Bf16 || cpu().amx_bf16)
}

/// Defines a tier's token and the ways to get one, each `None` unless detection proved it.
macro_rules! tokens {
    ($($(#[$doc:meta])* $token:ident = $tier:ident, $features:literal;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $token(());

        impl $token {
            /// The target features a function taking this token may enable.
            pub const FEATURES: &'static str = $features;

            /// The token, if `isa` (capped at the detected tier) reaches this tier: how a
            /// kernel asked to run on a given tier obtains its proof.
            pub fn at_most(isa: Isa) -> Option<$token> {
                (isa.min(detected()) >= Isa::$tier).then_some($token(()))
            }

            /// The token within the ceiling (`SRT_CPU_ISA`): what the kernels run.
            pub fn active() -> Option<$token> {
                $token::at_most(active())
            }

            /// The token whatever the ceiling: for tests that compare every tier the CPU has.
            pub fn detected() -> Option<$token> {
                $token::at_most(detected())
            }
        }
    )*};
}

tokens! {
    /// Proof that the CPU runs AVX2, FMA and F16C.
    Avx2 = Avx2, "avx,avx2,fma,f16c";
    /// Proof that the CPU runs AVX-512 F and BW (and so every `Avx2` feature).
    Avx512 = Avx512, "avx,avx2,fma,f16c,avx512f,avx512bw";
    /// Proof that the CPU runs AVX-512 VNNI (and so every `Avx512` feature).
    Avx512Vnni = Avx512Vnni, "avx,avx2,fma,f16c,avx512f,avx512bw,avx512vnni";
    /// Proof that the CPU runs AVX-512 BF16 (and so every `Avx512Vnni` feature).
    Avx512Bf16 = Avx512Bf16, "avx,avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512bf16";
}

/// Proof that the CPU runs AMX-BF16 beside AVX-512 BF16, and that this process may (see the
/// module: not a tier). The tile instructions are inline assembly, which needs no target
/// feature; functions taking this token enable the AVX-512 BF16 tier's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmxBf16(());

impl AmxBf16 {
    /// The target features a function taking this token may enable.
    pub const FEATURES: &'static str = Avx512Bf16::FEATURES;

    /// The token, if the CPU has AMX-BF16 and `isa` (capped at the detected tier) is the top
    /// tier.
    pub fn at_most(isa: Isa) -> Option<AmxBf16> {
        (isa.min(detected()) == Isa::Avx512Bf16)
            .then(AmxBf16::detected)
            .flatten()
    }

    /// The token whatever the ceiling: for tests that compare every kernel the CPU has.
    pub fn detected() -> Option<AmxBf16> {
        cpu().amx_tiles.then_some(AmxBf16(()))
    }
}

impl From<AmxBf16> for Avx512Bf16 {
    fn from(_: AmxBf16) -> Avx512Bf16 {
        Avx512Bf16(())
    }
}

/// Proof that the CPU runs AVX-VNNI beside AVX2, FMA and F16C (see the module: not a tier).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvxVnni(());

impl AvxVnni {
    /// The target features a function taking this token may enable.
    pub const FEATURES: &'static str = "avx,avx2,fma,f16c,avxvnni";

    /// The token, if the CPU has AVX-VNNI and `ceiling` counts it in.
    pub fn within(ceiling: Ceiling) -> Option<AvxVnni> {
        (ceiling.avx_vnni && ceiling.tier >= Isa::Avx2)
            .then(AvxVnni::detected)
            .flatten()
    }

    /// The token within the ceiling (`SRT_CPU_ISA`): what the kernels run.
    pub fn active() -> Option<AvxVnni> {
        AvxVnni::within(ceiling())
    }

    /// The token whatever the ceiling: for tests that compare every kernel the CPU has.
    pub fn detected() -> Option<AvxVnni> {
        cpu().avx_vnni.then_some(AvxVnni(()))
    }
}

impl From<AvxVnni> for Avx2 {
    fn from(_: AvxVnni) -> Avx2 {
        Avx2(())
    }
}

/// A higher tier's token proves every lower tier.
macro_rules! proves {
    ($($higher:ident => $lower:ident),*) => {$(
        impl From<$higher> for $lower {
            fn from(_: $higher) -> $lower {
                $lower(())
            }
        }
    )*};
}

proves!(
    Avx512 => Avx2,
    Avx512Vnni => Avx2,
    Avx512Vnni => Avx512,
    Avx512Bf16 => Avx2,
    Avx512Bf16 => Avx512,
    Avx512Bf16 => Avx512Vnni
);

#[cfg(test)]
mod tests;
