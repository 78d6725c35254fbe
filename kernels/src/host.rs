//! [`HostData`]: a plain host array (dtype, shape, f32 or i32 values) for kernel inputs and
//! reference outputs. It carries no interpreter or MLIR type, so the kernel library stays
//! free of both; tools convert it to their own arrays (e.g. `palladium_interpret::HostArray`).

use palladium_dsl::DType;

/// The element values of a [`HostData`].
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    /// Float dtypes (bf16 and f16 values are exactly representable, i.e. already rounded).
    F32(Vec<f32>),
    /// Integer dtypes.
    I32(Vec<i32>),
}

/// A dense row-major host array.
#[derive(Clone, Debug, PartialEq)]
pub struct HostData {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub values: Values,
}

impl HostData {
    fn checked(dtype: DType, shape: &[usize], values: Values) -> Self {
        let n = match &values {
            Values::F32(v) => v.len(),
            Values::I32(v) => v.len(),
        };
        assert_eq!(shape.iter().product::<usize>(), n, "HostData: shape {shape:?} does not hold {n} elements");
        HostData { dtype, shape: shape.to_vec(), values }
    }

    /// A bf16 array; the values are rounded to bf16 (a no-op for values that already are).
    pub fn bf16(shape: &[usize], values: Vec<f32>) -> Self {
        Self::checked(DType::Bf16, shape, Values::F32(values.into_iter().map(crate::reference::round_bf16).collect()))
    }

    pub fn f32(shape: &[usize], values: Vec<f32>) -> Self {
        Self::checked(DType::F32, shape, Values::F32(values))
    }

    pub fn i32(shape: &[usize], values: Vec<i32>) -> Self {
        Self::checked(DType::I32, shape, Values::I32(values))
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The float values. Panics for an integer array (a reference reading the wrong operand).
    pub fn f32s(&self) -> &[f32] {
        match &self.values {
            Values::F32(v) => v,
            Values::I32(_) => panic!("expected a float array, got {}{:?}", self.dtype, self.shape),
        }
    }

    /// The integer values. Panics for a float array.
    pub fn i32s(&self) -> &[i32] {
        match &self.values {
            Values::I32(v) => v,
            Values::F32(_) => panic!("expected an integer array, got {}{:?}", self.dtype, self.shape),
        }
    }

    /// The values as f32 (integers converted).
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.values {
            Values::F32(v) => v.clone(),
            Values::I32(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }

    /// `bf16[8,128]`, as in call specs.
    pub fn type_string(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        format!("{}[{}]", self.dtype, dims.join(","))
    }
}
