//! Element types: what a kernel, a host array and a checkpoint tensor hold.

use std::fmt;

/// Element types a kernel can hold. Integers are signless (as in Mosaic); the op chooses
/// signed or unsigned semantics.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum DType {
    Bf16,
    F16,
    F32,
    /// 8-bit float, e4m3 with finite values only (`f8E4M3FN`).
    F8E4M3,
    /// 8-bit float, e5m2 (`f8E5M2`).
    F8E5M2,
    I32,
    I16,
    I8,
    I4,
    Bool,
}

impl DType {
    pub const ALL: [DType; 10] = [
        DType::Bf16,
        DType::F16,
        DType::F32,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::I4,
        DType::Bool,
    ];

    /// Bits of one element as the TPU stores it in vregs. Bool is 32 bits in memory
    /// (Mosaic stores bools as i32), see [`DType::memory_bits`].
    pub fn bits(self) -> u32 {
        match self {
            DType::F32 | DType::I32 => 32,
            DType::Bf16 | DType::F16 | DType::I16 => 16,
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 => 8,
            DType::I4 => 4,
            DType::Bool => 1,
        }
    }

    /// Bits of one element in a memref (bools are widened to i32 at the kernel boundary).
    pub fn memory_bits(self) -> u32 {
        if self == DType::Bool { 32 } else { self.bits() }
    }

    /// Bytes of one element in a [`HostArray`](crate::HostArray): numpy's layout, as PJRT's
    /// host buffers take it (bool, int4 and the 8-bit floats one byte each).
    pub fn host_bytes(self) -> usize {
        self.bits().div_ceil(8) as usize
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::Bf16 | DType::F16 | DType::F32 | DType::F8E4M3 | DType::F8E5M2)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I16 | DType::I8 | DType::I4)
    }

    /// Native (sublane, lane) tile of a 2-D block in VMEM: (8,128) for 32-bit, (16,128) for
    /// 16-bit, (32,128) for 8-bit, (64,128) for 4-bit types.
    pub fn native_tile(self) -> (u64, u64) {
        let bits = u64::from(self.memory_bits());
        (8 * 32 / bits, 128)
    }

    /// The spelling used in our IR text, in CLI `--set` values and in oracle call specs.
    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::F8E4M3 => "f8e4m3fn",
            DType::F8E5M2 => "f8e5m2",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::I4 => "i4",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DType::ALL.into_iter().find(|d| d.name() == s).ok_or_else(|| {
            let known: Vec<_> = DType::ALL.iter().map(|d| d.name()).collect();
            format!("unknown dtype `{s}` (known: {})", known.join(", "))
        })
    }
}
