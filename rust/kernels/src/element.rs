//! The element types of the CPU kernels' tensors: float32, and bfloat16 as its 16 bits
//! ([`Bf16`]). Kernels load elements as float32, compute in float32 and round once per value
//! they store, so a bf16 kernel rounds where PyTorch's bf16 operators round.
//!
//! Why bits: Rust has no bf16 type, and the binding receives a bf16 tensor's memory as an
//! int16 buffer (numpy has no bf16 either).

/// A bfloat16 value: the upper 16 bits of a float32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// The float32 with these upper bits (exact).
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }

    /// `value` rounded to the nearest bf16, ties to even (as PyTorch rounds); NaN stays NaN.
    /// Written without branches so that loops of it vectorize.
    #[inline(always)]
    pub fn from_f32(value: f32) -> Bf16 {
        let bits = value.to_bits();
        let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
        // A NaN keeps its sign and becomes quiet (rounding could carry it into infinity).
        let nan = (bits >> 16) | 0x40;
        Bf16(if value.is_nan() { nan } else { rounded } as u16)
    }
}

/// A tensor element the kernels read and write.
pub trait Element: Copy + Send + Sync + 'static {
    /// Whether storing a float32 loses precision (PyTorch's "reduced" floating types), where
    /// kernels follow PyTorch's reduced-type arithmetic.
    const REDUCED: bool;
    /// The value as a float32 (exact for both types).
    fn load(self) -> f32;
    /// `value` rounded to this type.
    fn store(value: f32) -> Self;
}

impl Element for f32 {
    const REDUCED: bool = false;

    #[inline(always)]
    fn load(self) -> f32 {
        self
    }

    #[inline(always)]
    fn store(value: f32) -> f32 {
        value
    }
}

impl Element for Bf16 {
    const REDUCED: bool = true;

    #[inline(always)]
    fn load(self) -> f32 {
        self.to_f32()
    }

    #[inline(always)]
    fn store(value: f32) -> Bf16 {
        Bf16::from_f32(value)
    }
}

/// `values` rounded to bf16, for tests and references.
pub fn to_bf16(values: &[f32]) -> Vec<Bf16> {
    values.iter().map(|&v| Bf16::from_f32(v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round to nearest even, computed the slow way: the two neighbouring bf16 values and
    /// the distance to each, in float64.
    fn reference(value: f32) -> u16 {
        let bits = value.to_bits();
        let down = (bits >> 16) as u16;
        let up = down.wrapping_add(1);
        let (low, high) = (f64::from(Bf16(down).to_f32()), f64::from(Bf16(up).to_f32()));
        let exact = f64::from(value);
        let (to_low, to_high) = ((exact - low).abs(), (high - exact).abs());
        if to_low < to_high || (to_low == to_high && down.is_multiple_of(2)) {
            down
        } else {
            up
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        let values = crate::test_values::values(20_000, 9);
        for (i, &v) in values.iter().enumerate() {
            let v = v * 10f32.powi(i as i32 % 20 - 10);
            assert_eq!(Bf16::from_f32(v).0, reference(v), "{v}");
            assert_eq!(Bf16::from_f32(-v).0, reference(-v), "{}", -v);
        }
        // Ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 and goes to the even one (1).
        assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
        assert_eq!(
            Bf16::from_f32(1.0 + 3.0 / 256.0).to_f32(),
            1.0 + 4.0 / 256.0
        );
        for exact in [0.0, -0.0, 1.0, -2.5, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(Bf16::from_f32(exact).to_f32().to_bits(), exact.to_bits());
        }
        // The largest float32 is past bf16's range and rounds to infinity, as in PyTorch.
        assert_eq!(Bf16::from_f32(f32::MAX).to_f32(), f32::INFINITY);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
        assert!(Bf16::from_f32(f32::from_bits(0x7f80_0001))
            .to_f32()
            .is_nan());
    }
}
