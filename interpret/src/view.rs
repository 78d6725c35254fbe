//! Memref views: a box of a buffer, addressed by the buffer's index. Values hold views
//! ([`crate::value::Val::Ref`]); the memory model resolves them against its buffers.

use smallvec::SmallVec;

/// Dims of a view, a tile or a buffer.
pub(crate) type Shape = SmallVec<[usize; 4]>;

/// A box of a buffer: `start`/`size` in the buffer's own coordinates, and which of the
/// buffer's dims are visible (the rest were squeezed away and have size 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct View {
    pub buf: usize,
    pub start: Shape,
    pub size: Shape,
    pub dims: SmallVec<[u8; 4]>,
}

impl View {
    pub fn shape(&self) -> Shape {
        self.dims.iter().map(|&d| self.size[d as usize]).collect()
    }

    pub fn elems(&self) -> usize {
        self.size.iter().product()
    }

    /// Whether the two boxes share an element.
    pub fn overlaps(&self, other: &View) -> bool {
        self.buf == other.buf
            && (0..self.start.len()).all(|d| {
                self.start[d] < other.start[d] + other.size[d]
                    && other.start[d] < self.start[d] + self.size[d]
            })
    }
}
