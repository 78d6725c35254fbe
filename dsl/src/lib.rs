//! Palladium's front end: the core kernel IR ([`ir`]), the call spec ([`spec`]) and the
//! tracing builder ([`trace`]) that `#[kernel]` functions run to produce an [`ir::Kernel`].
//!
//! Kernel code uses the [`prelude`]: handles ([`trace::Val`], [`trace::Ref`],
//! [`trace::SemRef`]) with numpy-style operators, plus Pallas-like free functions.

pub mod ir;
pub mod spec;
pub mod target;
pub mod trace;

pub use ir::{DType, Kernel};
pub use palladium_macros::kernel;
pub use trace::{BuildError, BuildErrors};

/// What kernel code imports.
pub mod prelude {
    #![allow(non_upper_case_globals)]
    pub use crate::ir::{DType, DotDims, Precision};
    pub use crate::kernel;
    pub use crate::spec::Chip;
    pub use crate::trace::{
        Dims, Dma, Drain, Ref, Scope, SemRef, Val, async_copy, axis_index, barrier_semaphore,
        concatenate, debug_print, device_id, dot, dot_general, dot_t, ds, fori, full, iota,
        num_programs, pipeline, pipeline_lagged, program_id, remote_copy, run_scoped, scalar,
        select, switch, unrolled, zeros,
    };

    // Dtype names as values, so kernel code reads `x.cast(bf16)` as in JAX. They are
    // constants (value namespace only), so the primitive types `f32`/`i32` stay usable.
    pub const bf16: DType = DType::Bf16;
    pub const f16: DType = DType::F16;
    pub const f32: DType = DType::F32;
    pub const i32: DType = DType::I32;
    pub const i16: DType = DType::I16;
    pub const i8: DType = DType::I8;
    pub const int4: DType = DType::I4;
    pub const float8_e4m3: DType = DType::F8E4M3;
    pub const float8_e5m2: DType = DType::F8E5M2;
    pub const bool_: DType = DType::Bool;
}

/// The builder API for code that assembles kernels or kernel bodies without `#[kernel]`:
/// the library's composable bodies (functions over refs
/// and values) and generated kernels such as the decode megakernel. Comparisons are plain
/// functions here because Rust's `<` must return `bool`; `#[kernel]` rewrites the operators
/// into the same calls.
pub mod build {
    pub use crate::ir::{CmpPred, MemorySpace, SemKind};
    pub use crate::spec::{OperandRole, PipelineMode};
    pub use crate::trace::{
        Carry, Compare, Drain, IntoVal, KernelBuilder, ParamError, TracedRange, for_range, if_else,
        pipeline, pipeline_lagged, range, switch, while_loop,
    };

    macro_rules! comparisons {
        ($($name:ident => $pred:ident, $doc:literal;)*) => {$(
            #[doc = $doc]
            #[track_caller]
            pub fn $name<A: Compare<B>, B>(a: A, b: B) -> A::Output {
                a.compare(CmpPred::$pred, b)
            }
        )*};
    }
    comparisons! {
        eq => Eq, "`a == b`, traced when either side is.";
        ne => Ne, "`a != b`, traced when either side is.";
        lt => Lt, "`a < b`, traced when either side is.";
        le => Le, "`a <= b`, traced when either side is.";
        gt => Gt, "`a > b`, traced when either side is.";
        ge => Ge, "`a >= b`, traced when either side is.";
    }
}

/// Paths the `#[kernel]` macro expands to. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::Kernel;
    pub use crate::ir::{CmpPred, DType, MemorySpace, SemKind};
    pub use crate::spec::{BlockDim, OperandRole, PipelineMode, Semantics};
    pub use crate::trace::builder_handles::{Handle, Sealed};
    pub use crate::trace::params::{self as size, Checks, Size};
    pub use crate::trace::{
        BuildErrors, Carry, Compare, Cond, IndexElem, IntoIndex, IntoVal, KernelBuilder,
        ParamError, Ref, SemRef, Val, for_range, if_else, while_loop,
    };

    /// `a <pred> b`, traced when either side is.
    #[track_caller]
    pub fn cmp<A: Compare<B>, B>(pred: CmpPred, a: A, b: B) -> A::Output {
        a.compare(pred, b)
    }

    /// `ref[idx]` in a kernel body is `(&ref).__pd_index(idx)`: a load for refs, a static
    /// slice for values (this trait) and plain indexing for anything else ([`IndexStd`]), picked by autoref
    /// method resolution since the macro cannot see types.
    pub trait IndexRef {
        fn __pd_index<I: IntoIndex>(&self, idx: I) -> Val;
    }

    impl IndexRef for Ref {
        #[track_caller]
        fn __pd_index<I: IntoIndex>(&self, idx: I) -> Val {
            self.load(idx)
        }
    }

    impl IndexRef for Val {
        #[track_caller]
        fn __pd_index<I: IntoIndex>(&self, idx: I) -> Val {
            self.slice(idx)
        }
    }

    /// Plain Rust indexing inside a kernel body (trace-time arrays of parameters).
    pub trait IndexStd<I> {
        type Output;
        fn __pd_index(self, idx: I) -> Self::Output;
    }

    impl<I, T: std::ops::Index<I> + ?Sized> IndexStd<I> for &T
    where
        T::Output: Clone + Sized,
    {
        type Output = T::Output;
        fn __pd_index(self, idx: I) -> T::Output {
            self[idx].clone()
        }
    }

    /// `ref[idx] = value` in a kernel body.
    #[track_caller]
    pub fn index_store<I: IntoIndex, V: IntoVal>(base: &Ref, idx: I, value: V) {
        base.store(idx, value)
    }

    /// `a && b` / `a || b`: logical on traced bools, short-circuit on Rust bools.
    pub trait Logic<B> {
        type Output;
        fn and(self, rhs: impl FnOnce() -> B) -> Self::Output;
        fn or(self, rhs: impl FnOnce() -> B) -> Self::Output;
    }

    impl Logic<bool> for bool {
        type Output = bool;
        fn and(self, rhs: impl FnOnce() -> bool) -> bool {
            self && rhs()
        }
        fn or(self, rhs: impl FnOnce() -> bool) -> bool {
            self || rhs()
        }
    }

    impl<B: IntoVal> Logic<B> for Val {
        type Output = Val;
        #[track_caller]
        fn and(self, rhs: impl FnOnce() -> B) -> Val {
            self & rhs().into_val_like(self)
        }
        #[track_caller]
        fn or(self, rhs: impl FnOnce() -> B) -> Val {
            self | rhs().into_val_like(self)
        }
    }

    #[track_caller]
    pub fn and<A: Logic<B>, B>(a: A, b: impl FnOnce() -> B) -> A::Output {
        a.and(b)
    }

    #[track_caller]
    pub fn or<A: Logic<B>, B>(a: A, b: impl FnOnce() -> B) -> A::Output {
        a.or(b)
    }
}
