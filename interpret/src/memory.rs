//! Buffers (HBM arrays, VMEM/SMEM windows and scratch, semaphores), memref views into them,
//! and the DMA engine model: a DMA copies its data when it starts, but its destination is
//! *pending* (unreadable, unwritable, not a valid target for another DMA) and its source
//! must not be overwritten until a wait on its semaphore retires it.

use crate::error::{ErrorKind, InterpError, Result, bail};
use crate::value::{
    DType, Data, Shape, Tile, contiguous, copy_strided, gather, scatter, strides_of,
};
use crate::view::View;
use smallvec::SmallVec;
use std::sync::Arc;

/// Where a buffer lives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Space {
    Vmem,
    Smem,
    /// `any` / `hbm`.
    Hbm,
    Semaphore,
    Other,
}

impl Space {
    pub fn parse(s: Option<&str>) -> Space {
        match s {
            Some("vmem") | None => Space::Vmem,
            Some("smem") => Space::Smem,
            Some("any" | "hbm") => Space::Hbm,
            Some("semaphore_mem") => Space::Semaphore,
            _ => Space::Other,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Buffer {
    pub dt: DType,
    pub shape: Shape,
    pub strides: Shape,
    /// Shared copy-on-write, so the tasks of a parallel grid start from the same arrays
    /// without copying them.
    pub data: Arc<Data>,
    #[allow(dead_code)]
    pub space: Space,
    pub name: String,
    pub alive: bool,
    /// Fresh memory not written yet, per chunk along dim 0 (see [`Memory::settle`]): `true`
    /// while chunk k still has to be filled with poison before anything reads it or writes
    /// part of it. Empty when every chunk is settled.
    unfilled: Vec<bool>,
    /// How many of `unfilled` are `true`.
    pending: usize,
    /// Chunks along dim 0 (as `unfilled`) whose contents are, for now, another buffer's
    /// storage: a DMA of a whole chunk from a kept input lends it instead of copying (see
    /// [`Memory::lend`]). Empty when no chunk is lent.
    lent: Vec<Option<Lent>>,
}

/// A chunk's contents held in another buffer's storage: `per` elements from `off`.
#[derive(Clone, Debug)]
struct Lent {
    data: Arc<Data>,
    off: usize,
}

impl Buffer {
    /// For a read of `region` (at `off` in this buffer) inside one lent chunk: the lender's
    /// storage and the region's offset in it.
    fn lent_at(&self, region: &View, off: isize) -> Option<(&Data, isize)> {
        if self.lent.is_empty() {
            return None;
        }
        let (lo, hi, _) = self.touched(region, false);
        let l = self.lent.get(lo)?.as_ref().filter(|_| hi == lo + 1)?;
        let per = self.data.len() / self.chunks();
        Some((&*l.data, l.off as isize + off - (lo * per) as isize))
    }

    /// Chunks along dim 0 for lazy poison and lent contents: one per index of dim 0 (a ring
    /// slot, a row of a window), or the whole buffer as one chunk.
    fn chunks(&self) -> usize {
        match self.shape.first() {
            Some(&d) if self.shape.len() > 1 && d <= MAX_CHUNKS => d,
            _ => 1,
        }
    }

    /// The chunks `region` touches, and whether (for a write, `overwrite`) it covers each
    /// of them whole: it spans every element of dims 1.. (all of the buffer when it is one
    /// chunk).
    fn touched(&self, region: &View, overwrite: bool) -> (usize, usize, bool) {
        let chunks = self.chunks();
        let (lo, hi) = if chunks == 1 {
            (0, usize::from(region.elems() > 0))
        } else {
            (region.start[0], region.start[0] + region.size[0])
        };
        let whole = overwrite
            && (usize::from(chunks > 1)..self.shape.len())
                .all(|d| region.start[d] == 0 && region.size[d] == self.shape[d]);
        (lo, hi, whole)
    }
}

/// Buffers of at least this many elements are poisoned lazily (smaller ones on allocation).
const LAZY_POISON_MIN: usize = 1 << 15;
/// At most this many chunks along dim 0 (a longer dim 0 is one chunk).
const MAX_CHUNKS: usize = 1 << 12;

/// Which end of a copy a DMA in flight is, on this device.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum DmaEnd {
    /// Both ends here.
    Local,
    /// A remote copy's sender: its source must stay unwritten until the send wait; its
    /// destination is on another device.
    Outgoing,
    /// A remote copy's receiver: its destination (here `src` and `dst` both) is pending.
    Incoming,
}

/// A DMA in flight.
#[derive(Clone, Debug)]
pub(crate) struct Dma {
    pub src: View,
    pub dst: View,
    pub end: DmaEnd,
    /// The semaphore it signals: buffer and element.
    pub sem: (usize, usize),
    pub bytes: i64,
    /// "`tpu.enqueue_dma` at line 12:7, grid point (0)".
    pub started: String,
}

#[derive(Clone, Default, Debug)]
pub(crate) struct Memory {
    pub bufs: Vec<Buffer>,
    pub dmas: Vec<Dma>,
    scopes: Vec<Vec<usize>>,
}

impl Memory {
    /// A fresh buffer. Fresh memory is poison: NaN for floats, `i32::MIN` for ints (0 for
    /// semaphores). Large buffers are poisoned lazily, chunk by chunk along dim 0 when first
    /// touched ([`Memory::settle`]): a chunk a DMA or a store overwrites whole (a ring slot)
    /// is never filled, and its storage comes recycled from an earlier run as it was.
    pub fn alloc(&mut self, dt: DType, shape: &[usize], space: Space, name: String) -> usize {
        let n: usize = shape.iter().product();
        if dt.is_sem() {
            return self.adopt(dt, shape, space, name, Arc::new(Data::I(vec![0; n])));
        }
        if n < LAZY_POISON_MIN {
            return self.adopt(
                dt,
                shape,
                space,
                name,
                Arc::new(Data::filled(dt, n, f32::NAN, i32::MIN)),
            );
        }
        let id = self.adopt(dt, shape, space, name, Arc::new(Data::stale(dt, n)));
        self.unfill(id);
        id
    }

    /// Mark all of `buf` as fresh poison, to be filled where first touched.
    fn unfill(&mut self, buf: usize) {
        let b = &mut self.bufs[buf];
        let chunks = b.chunks();
        b.lent = Vec::new();
        b.unfilled = vec![true; chunks];
        b.pending = chunks;
    }

    /// Before `region` is read (`overwrite = false`) or written whole (`true`): fill the
    /// fresh chunks it touches with poison, except, for a write, the chunks it covers whole.
    /// So a kernel reading memory nothing wrote still sees the poison. Lent chunks it
    /// touches get their contents copied in (what the DMA did not), or, overwritten whole,
    /// are just given back.
    fn settle(&mut self, region: &View, overwrite: bool) {
        let b = &mut self.bufs[region.buf];
        if b.pending == 0 && b.lent.is_empty() {
            return;
        }
        let per = b.data.len() / b.chunks();
        let (lo, hi, whole) = b.touched(region, overwrite);
        if !b.lent.is_empty() {
            for k in lo..hi {
                let Some(l) = b.lent[k].take() else { continue };
                if !whole {
                    match (Arc::make_mut(&mut b.data), &*l.data) {
                        (Data::F(d), Data::F(s)) => {
                            d[k * per..(k + 1) * per].copy_from_slice(&s[l.off..l.off + per])
                        }
                        (Data::I(d), Data::I(s)) => {
                            d[k * per..(k + 1) * per].copy_from_slice(&s[l.off..l.off + per])
                        }
                        _ => unreachable!("a chunk is lent by storage of its own element kind"),
                    }
                }
            }
            if b.lent.iter().all(Option::is_none) {
                b.lent = Vec::new();
            }
        }
        if b.pending == 0 {
            return;
        }
        for k in lo..hi {
            if !b.unfilled[k] {
                continue;
            }
            if !whole {
                match Arc::make_mut(&mut b.data) {
                    Data::F(d) => d[k * per..(k + 1) * per].fill(f32::NAN),
                    Data::I(d) => d[k * per..(k + 1) * per].fill(i32::MIN),
                }
            }
            b.unfilled[k] = false;
            b.pending -= 1;
        }
        if b.pending == 0 {
            b.unfilled = Vec::new();
        }
    }

    /// All of `buf` settled (every fresh chunk filled): its storage as the kernel left it.
    pub fn settled(&mut self, buf: usize) -> &Arc<Data> {
        let whole = self.whole(buf);
        self.settle(&whole, false);
        &self.bufs[buf].data
    }

    /// Replace all of `buf`'s contents by `data` (its element count).
    pub fn replace(&mut self, buf: usize, data: Arc<Data>) {
        debug_assert_eq!(data.len(), self.bufs[buf].data.len());
        let b = &mut self.bufs[buf];
        b.data = data;
        b.unfilled = Vec::new();
        b.pending = 0;
        b.lent = Vec::new();
    }

    /// A new buffer holding `data` (`shape.product()` elements of `dt`).
    pub fn adopt(
        &mut self,
        dt: DType,
        shape: &[usize],
        space: Space,
        name: String,
        data: Arc<Data>,
    ) -> usize {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        self.bufs.push(Buffer {
            dt,
            shape: shape.into(),
            strides: strides_of(shape),
            data,
            space,
            name,
            alive: true,
            unfilled: Vec::new(),
            pending: 0,
            lent: Vec::new(),
        });
        let id = self.bufs.len() - 1;
        if let Some(s) = self.scopes.last_mut() {
            s.push(id);
        }
        id
    }

    /// The run is over: keep the large vectors no one else holds for the next run.
    pub fn recycle(self) {
        for b in self.bufs {
            if let Ok(d) = Arc::try_unwrap(b.data) {
                d.recycle();
            }
        }
    }

    pub fn whole(&self, buf: usize) -> View {
        let b = &self.bufs[buf];
        View {
            buf,
            start: SmallVec::from_elem(0, b.shape.len()),
            size: b.shape.clone(),
            dims: (0..b.shape.len() as u8).collect(),
        }
    }

    fn live(&self, v: &View) -> Result<&Buffer> {
        let b = &self.bufs[v.buf];
        if !b.alive {
            bail!(DmaRace, "use of `{}` after the end of the region that allocated it", b.name);
        }
        Ok(b)
    }

    pub fn describe(&self, v: &View) -> String {
        let b = &self.bufs[v.buf];
        let r: Vec<String> = (0..v.start.len())
            .map(|d| {
                if v.size[d] == 1 {
                    format!("{}", v.start[d])
                } else {
                    format!("{}..{}", v.start[d], v.start[d] + v.size[d])
                }
            })
            .collect();
        format!("{}[{}]", b.name, r.join(", "))
    }

    // --- views ------------------------------------------------------------------------------

    pub fn slice(&self, v: &View, offsets: &[i64], sizes: &[usize]) -> Result<View> {
        self.live(v)?;
        if offsets.len() != v.dims.len() || sizes.len() != v.dims.len() {
            bail!(
                Malformed,
                "slice of a rank-{} memref with {} offsets and {} sizes",
                v.dims.len(),
                offsets.len(),
                sizes.len()
            );
        }
        let mut out = v.clone();
        for (d, (&o, &s)) in offsets.iter().zip(sizes).enumerate() {
            let bd = v.dims[d] as usize;
            if o < 0 || o as usize + s > v.size[bd] {
                bail!(
                    OutOfBounds,
                    "slice [{}] of size [{}] is out of bounds of {} (shape [{}])",
                    join(offsets),
                    join(sizes),
                    self.describe(v),
                    join(&v.shape())
                );
            }
            out.start[bd] += o as usize;
            out.size[bd] = s;
        }
        Ok(out)
    }

    /// `tpu.memref_squeeze`: drop unit dims so the view has `shape` (unit dims address
    /// nothing, so which ones are dropped does not matter).
    pub fn squeeze(&self, v: &View, shape: &[usize]) -> Result<View> {
        let mut non_unit = v.dims.iter().copied().filter(|&d| v.size[d as usize] != 1);
        let mut unit = v.dims.iter().copied().filter(|&d| v.size[d as usize] == 1);
        let mut dims = SmallVec::new();
        let bad = || {
            InterpError::new(
                ErrorKind::Malformed,
                format!("cannot squeeze [{}] to [{}]", join(&v.shape()), join(shape)),
            )
        };
        for &s in shape {
            let d = if s == 1 {
                unit.next()
            } else {
                non_unit.next().filter(|&d| v.size[d as usize] == s)
            };
            dims.push(d.ok_or_else(bad)?);
        }
        if non_unit.next().is_some() {
            return Err(bad());
        }
        Ok(View { dims, ..v.clone() })
    }

    /// The sub-view accessed by a `vshape` access at `idx` (vector dims align with the
    /// trailing memref dims).
    pub fn access(&self, v: &View, idx: &[i64], vshape: &[usize]) -> Result<View> {
        let rank = v.dims.len();
        if idx.len() != rank || vshape.len() > rank {
            bail!(
                Malformed,
                "access of a rank-{rank} memref with {} indices and a rank-{} value",
                idx.len(),
                vshape.len()
            );
        }
        let lead = rank - vshape.len();
        let mut out = v.clone();
        for d in 0..rank {
            let bd = v.dims[d] as usize;
            let ext = if d < lead { 1 } else { vshape[d - lead] };
            if idx[d] < 0 || idx[d] as usize + ext > v.size[bd] {
                bail!(
                    OutOfBounds,
                    "access at [{}] of shape [{}] is out of bounds of {} (shape [{}])",
                    join(idx),
                    join(vshape),
                    self.describe(v),
                    join(&v.shape())
                );
            }
            out.start[bd] += idx[d] as usize;
            out.size[bd] = ext;
        }
        Ok(out)
    }

    fn layout(&self, v: &View) -> (isize, SmallVec<[isize; 4]>, Shape) {
        let b = &self.bufs[v.buf];
        let off = v.start.iter().zip(&b.strides).map(|(s, t)| (s * t) as isize).sum();
        let strides = v.dims.iter().map(|&d| b.strides[d as usize] as isize).collect();
        (off, strides, v.shape())
    }

    // --- races ------------------------------------------------------------------------------

    /// A read (`write = false`) or write of `region`: it must not overlap the destination of
    /// a DMA in flight, and a write must not overlap a DMA's source.
    pub fn check_access(&self, region: &View, write: bool, what: &str) -> Result<()> {
        for d in &self.dmas {
            if d.end != DmaEnd::Outgoing && d.dst.overlaps(region) {
                bail!(
                    DmaRace,
                    "{what} {} overlaps {}, the destination of a DMA still in flight (started by {}); wait on its semaphore first",
                    self.describe(region),
                    self.describe(&d.dst),
                    d.started
                );
            }
            if write && d.src.overlaps(region) {
                bail!(
                    DmaRace,
                    "{what} {} overwrites {}, the source of a DMA still in flight (started by {})",
                    self.describe(region),
                    self.describe(&d.src),
                    d.started
                );
            }
        }
        Ok(())
    }

    // --- loads and stores -------------------------------------------------------------------

    /// The elements of a `vshape` access taken `steps` apart per dim (empty: contiguous,
    /// else one per vector dim): the region they span (checked for bounds and races as a
    /// whole, gaps included) and their strides in memory.
    fn stepped(
        &self,
        v: &View,
        idx: &[i64],
        vshape: &[usize],
        steps: &[usize],
    ) -> Result<(View, isize, SmallVec<[isize; 4]>)> {
        if !steps.is_empty() && steps.len() != vshape.len() {
            bail!(Malformed, "{} strides for a rank-{} access", steps.len(), vshape.len());
        }
        let span: Vec<usize> = vshape
            .iter()
            .enumerate()
            .map(|(d, &n)| match steps.get(d) {
                Some(&s) if n > 0 => (n - 1).saturating_mul(s).saturating_add(1),
                _ => n,
            })
            .collect();
        let region = self.access(v, idx, &span)?;
        let (off, strides, _) = self.layout(&region);
        let lead = strides.len() - vshape.len();
        let strides = strides[lead..]
            .iter()
            .enumerate()
            .map(|(d, &t)| t * steps.get(d).map_or(1, |&s| s as isize))
            .collect();
        Ok((region, off, strides))
    }

    pub fn load(
        &mut self,
        v: &View,
        idx: &[i64],
        vshape: &[usize],
        dt: DType,
        steps: &[usize],
    ) -> Result<Tile> {
        let (region, off, strides) = self.stepped(v, idx, vshape, steps)?;
        self.live(v)?;
        self.check_access(&region, false, "read of")?;
        let strides = &strides[..];
        // Inside one lent chunk: read the lender's storage (nothing copied in first).
        if let Some((data, at)) = self.bufs[v.buf].lent_at(&region, off) {
            let data = match data {
                Data::F(d) => Data::F(gather(d, at, strides, vshape)),
                Data::I(d) => Data::I(gather(d, at, strides, vshape)),
            };
            return Ok(Tile::new(dt, vshape.into(), data));
        }
        self.settle(&region, false);
        let b = &self.bufs[v.buf];
        // A load of the whole buffer (a block's window, a scratch accumulator) shares its
        // storage: a later store into the buffer copies it first (copy-on-write).
        if off == 0 && region.elems() == b.data.len() && contiguous(vshape, strides) {
            return Ok(Tile { dt, shape: vshape.into(), data: b.data.clone() });
        }
        let data = match &*b.data {
            Data::F(d) => Data::F(gather(d, off, strides, vshape)),
            Data::I(d) => Data::I(gather(d, off, strides, vshape)),
        };
        Ok(Tile::new(dt, vshape.into(), data))
    }

    pub fn store(
        &mut self,
        v: &View,
        idx: &[i64],
        t: &Tile,
        mask: Option<&Tile>,
        add: bool,
        steps: &[usize],
    ) -> Result<()> {
        let (region, off, strides) = self.stepped(v, idx, &t.shape, steps)?;
        self.live(v)?;
        self.check_access(&region, true, "write of")?;
        // Strided stores skip the gaps of the region they span.
        self.settle(&region, mask.is_none() && !add && steps.iter().all(|&s| s == 1));
        let m = mask.map(|m| m.i());
        let b = &mut self.bufs[v.buf];
        if b.dt != t.dt {
            bail!(Mismatch, "storing a {} vector into {} of {}", t.dt, b.name, b.dt);
        }
        // A plain store of the whole buffer takes the tile's storage (both are immutable
        // until the next write, which copies).
        if mask.is_none()
            && !add
            && off == 0
            && t.len() == b.data.len()
            && contiguous(&t.shape, &strides)
            && std::mem::discriminant(&*b.data) == std::mem::discriminant(&*t.data)
        {
            b.data = t.data.clone();
            return Ok(());
        }
        match (Arc::make_mut(&mut b.data), &*t.data) {
            (Data::F(d), Data::F(s)) => scatter(d, off, &strides, &t.shape, s, m, add),
            (Data::I(d), Data::I(s)) => scatter(d, off, &strides, &t.shape, s, m, add),
            _ => bail!(Mismatch, "store of mismatched element kind"),
        }
        Ok(())
    }

    pub fn load_scalar(&mut self, v: &View, idx: &[i64]) -> Result<crate::value::Val> {
        let region = self.access(v, idx, &[])?;
        self.live(v)?;
        self.check_access(&region, false, "read of")?;
        self.settle(&region, false);
        let b = &self.bufs[v.buf];
        let (off, _, _) = self.layout(&region);
        Ok(match &*b.data {
            Data::F(d) => crate::value::Val::Float(f64::from(d[off as usize])),
            Data::I(d) => crate::value::Val::Int(i64::from(d[off as usize])),
        })
    }

    pub fn store_scalar(&mut self, v: &View, idx: &[i64], x: &crate::value::Val) -> Result<()> {
        let region = self.access(v, idx, &[])?;
        self.live(v)?;
        self.check_access(&region, true, "write of")?;
        self.settle(&region, true);
        let (off, _, _) = self.layout(&region);
        let b = &mut self.bufs[v.buf];
        match (Arc::make_mut(&mut b.data), x) {
            (Data::F(d), crate::value::Val::Float(f)) => d[off as usize] = *f as f32,
            (Data::I(d), crate::value::Val::Int(i)) => d[off as usize] = *i as i32,
            _ => bail!(Mismatch, "scalar store of {} into {}", x.kind(), b.dt),
        }
        Ok(())
    }

    /// Copy `src` to `dst` (same shape), element by element.
    pub fn copy(&mut self, src: &View, dst: &View) -> Result<()> {
        let (so, ss, shape) = self.layout(src);
        let (doff, ds, dshape) = self.layout(dst);
        if shape != dshape {
            bail!(Mismatch, "copy between shapes [{}] and [{}]", join(&shape), join(&dshape));
        }
        if self.lend(src, dst) {
            return Ok(());
        }
        self.settle(src, false);
        self.settle(dst, true);
        // Within one buffer the regions may overlap: go through a copy of the source.
        let from = if src.buf == dst.buf {
            Arc::new(match &*self.bufs[src.buf].data {
                Data::F(d) => Data::F(gather(d, so, &ss, &shape)),
                Data::I(d) => Data::I(gather(d, so, &ss, &shape)),
            })
        } else {
            self.bufs[src.buf].data.clone()
        };
        let (so, ss): (isize, SmallVec<[isize; 4]>) = if src.buf == dst.buf {
            (0, strides_of(&shape).iter().map(|&x| x as isize).collect())
        } else {
            (so, ss)
        };
        let d = &mut self.bufs[dst.buf];
        // Overwriting all of a shared buffer (a window a parallel task inherited, a tile still
        // holding it): new storage rather than a copy of what is about to be overwritten.
        if Arc::strong_count(&d.data) > 1 && shape.iter().product::<usize>() == d.data.len() {
            d.data = Arc::new(Data::stale(d.dt, d.data.len()));
        }
        match (Arc::make_mut(&mut d.data), &*from) {
            (Data::F(d), Data::F(s)) => copy_strided(d, doff, &ds, s, so, &ss, &shape),
            (Data::I(d), Data::I(s)) => copy_strided(d, doff, &ds, s, so, &ss, &shape),
            _ => bail!(Mismatch, "copy between different element kinds"),
        }
        Ok(())
    }

    /// A copy of a contiguous `src` into exactly one large chunk of `dst` (a DMA into a
    /// weight ring's slot) from storage shared elsewhere (a kept input, or any array a tile
    /// or another task also holds): the chunk borrows the source's storage instead (nothing
    /// copied); reads inside the chunk read it there, anything else copies it in first
    /// ([`Memory::settle`]). The borrowed storage cannot change: a write to the source makes
    /// the source copy it first (`Arc::make_mut`), as it would have anyway while shared.
    /// Returns whether it lent.
    fn lend(&mut self, src: &View, dst: &View) -> bool {
        if src.buf == dst.buf {
            return false;
        }
        let (s, d) = (&self.bufs[src.buf], &self.bufs[dst.buf]);
        let chunks = d.chunks();
        if Arc::strong_count(&s.data) < 2
            || s.pending > 0
            || !s.lent.is_empty()
            || std::mem::discriminant(&*s.data) != std::mem::discriminant(&*d.data)
            || d.data.len() / chunks < LAZY_POISON_MIN
        {
            return false;
        }
        let (lo, hi, whole) = d.touched(dst, true);
        let (off, strides, shape) = self.layout(src);
        if !whole || hi != lo + 1 || !contiguous(&shape, &strides) {
            return false;
        }
        let data = s.data.clone();
        // The chunk's fresh poison or earlier loan goes: it is overwritten whole.
        self.settle(dst, true);
        let d = &mut self.bufs[dst.buf];
        if d.lent.is_empty() {
            d.lent = vec![None; chunks];
        }
        d.lent[lo] = Some(Lent { data, off: off as usize });
        true
    }

    pub fn fill_poison(&mut self, buf: usize) {
        let b = &mut self.bufs[buf];
        b.lent = Vec::new();
        if b.data.len() >= LAZY_POISON_MIN {
            // Shared (a recorded write-back, a parallel task's copy): new storage, no copy.
            if Arc::get_mut(&mut b.data).is_none() {
                b.data = Arc::new(Data::stale(b.dt, b.data.len()));
            }
            self.unfill(buf);
            return;
        }
        match Arc::get_mut(&mut b.data) {
            Some(Data::F(d)) => d.iter_mut().for_each(|x| *x = f32::NAN),
            Some(Data::I(d)) => d.iter_mut().for_each(|x| *x = i32::MIN),
            // Shared (a recorded write-back, a parallel task's copy): new storage, no copy.
            None => b.data = Arc::new(Data::filled(b.dt, b.data.len(), f32::NAN, i32::MIN)),
        }
    }

    // --- DMAs and semaphores ----------------------------------------------------------------

    /// The single semaphore a rank-0 semaphore view names.
    pub fn sem(&self, v: &View) -> Result<(usize, usize)> {
        let b = self.live(v)?;
        if !b.dt.is_sem() {
            bail!(Mismatch, "{} is not a semaphore", b.name);
        }
        if v.elems() != 1 || !v.dims.is_empty() && v.shape().iter().any(|&s| s != 1) {
            bail!(
                Malformed,
                "semaphore operand {} must be a single semaphore (rank 0)",
                self.describe(v)
            );
        }
        let (off, _, _) = self.layout(v);
        Ok((v.buf, off as usize))
    }

    pub fn sem_value(&self, s: (usize, usize)) -> i64 {
        match &*self.bufs[s.0].data {
            Data::I(d) => i64::from(d[s.1]),
            Data::F(_) => 0,
        }
    }

    fn sem_add(&mut self, s: (usize, usize), k: i64) {
        if let Data::I(d) = Arc::make_mut(&mut self.bufs[s.0].data) {
            d[s.1] = (i64::from(d[s.1]) + k) as i32;
        }
    }

    pub fn sem_name(&self, s: (usize, usize)) -> String {
        let b = &self.bufs[s.0];
        if b.shape.is_empty() { b.name.clone() } else { format!("{}[{}]", b.name, s.1) }
    }

    pub fn dma_start(&mut self, src: &View, dst: &View, sem: &View, started: String) -> Result<()> {
        let s = self.sem(sem)?;
        let (sdt, ddt) = (self.live(src)?.dt, self.live(dst)?.dt);
        if sdt != ddt {
            bail!(
                Mismatch,
                "DMA from {} ({sdt}) to {} ({ddt}): element types differ",
                self.describe(src),
                self.describe(dst)
            );
        }
        if src.shape() != dst.shape() {
            bail!(
                Mismatch,
                "DMA from {} to {}: shapes [{}] and [{}] differ",
                self.describe(src),
                self.describe(dst),
                join(&src.shape()),
                join(&dst.shape())
            );
        }
        for d in self.dmas.iter().filter(|d| d.end != DmaEnd::Outgoing) {
            if d.dst.overlaps(dst) {
                bail!(
                    DoubleDma,
                    "DMA into {} started while another DMA into {} is still in flight (started by {}); wait for it before reusing the buffer",
                    self.describe(dst),
                    self.describe(&d.dst),
                    d.started
                );
            }
            if d.dst.overlaps(src) {
                bail!(
                    DmaRace,
                    "DMA reads {}, the destination of a DMA still in flight (started by {})",
                    self.describe(src),
                    d.started
                );
            }
            if d.src.overlaps(dst) {
                bail!(
                    DmaRace,
                    "DMA writes {}, the source of a DMA still in flight (started by {})",
                    self.describe(dst),
                    d.started
                );
            }
        }
        self.check_access(src, false, "DMA source")?;
        self.copy(src, dst)?;
        let bytes = (dst.elems() * ddt.size()) as i64;
        self.dmas.push(Dma {
            src: src.clone(),
            dst: dst.clone(),
            end: DmaEnd::Local,
            sem: s,
            bytes,
            started,
        });
        Ok(())
    }

    /// The sending end of a remote copy into `dst` on another device (checked against this
    /// device's buffer of the same program position): the data leaves now, `send_sem`
    /// counts it at the send wait, and `src` must stay unwritten until then. Returns the
    /// data and its byte count.
    pub fn remote_send(
        &mut self,
        src: &View,
        dst: &View,
        send_sem: &View,
        started: String,
    ) -> Result<(Arc<Data>, i64)> {
        let s = self.sem(send_sem)?;
        let (sdt, ddt) = (self.live(src)?.dt, self.bufs[dst.buf].dt);
        if sdt != ddt || src.shape() != dst.shape() {
            bail!(
                Mismatch,
                "remote DMA from {} ({sdt}[{}]) to {} ({ddt}[{}]): element types or shapes differ",
                self.describe(src),
                join(&src.shape()),
                self.describe(dst),
                join(&dst.shape())
            );
        }
        self.check_access(src, false, "remote DMA source")?;
        self.settle(src, false);
        let (off, strides, shape) = self.layout(src);
        let data = match &*self.bufs[src.buf].data {
            Data::F(d) => Data::F(gather(d, off, &strides, &shape)),
            Data::I(d) => Data::I(gather(d, off, &strides, &shape)),
        };
        let bytes = (src.elems() * sdt.size()) as i64;
        self.dmas.push(Dma {
            src: src.clone(),
            dst: src.clone(),
            end: DmaEnd::Outgoing,
            sem: s,
            bytes,
            started,
        });
        Ok((Arc::new(data), bytes))
    }

    /// The receiving end of a remote copy: `data` lands in `dst` (this device's buffer at the
    /// sender's program position), which stays pending until a wait on `sem` retires it.
    pub fn remote_receive(
        &mut self,
        dst: &View,
        data: &Data,
        sem: (usize, usize),
        bytes: i64,
        started: String,
    ) -> Result<()> {
        let b = self.live(dst)?;
        if !self.bufs[sem.0].alive || !self.bufs[sem.0].dt.is_sem() {
            bail!(
                DmaRace,
                "a remote DMA ({started}) signals semaphore {}, which this device has not allocated (or has released)",
                self.bufs[sem.0].name
            );
        }
        let name = b.name.clone();
        for d in self.dmas.iter().filter(|d| d.end != DmaEnd::Outgoing) {
            if d.dst.overlaps(dst) {
                bail!(
                    DoubleDma,
                    "a remote DMA ({started}) lands in {} while another DMA into {} is still in flight (started by {})",
                    self.describe(dst),
                    self.describe(&d.dst),
                    d.started
                );
            }
        }
        self.settle(dst, true);
        let (off, strides, shape) = self.layout(dst);
        let from = strides_of(&shape).iter().map(|&x| x as isize).collect::<SmallVec<[isize; 4]>>();
        match (Arc::make_mut(&mut self.bufs[dst.buf].data), data) {
            (Data::F(d), Data::F(s)) => copy_strided(d, off, &strides, s, 0, &from, &shape),
            (Data::I(d), Data::I(s)) => copy_strided(d, off, &strides, s, 0, &from, &shape),
            _ => {
                bail!(Mismatch, "a remote DMA ({started}) of another element kind lands in {name}")
            }
        }
        self.dmas.push(Dma {
            src: dst.clone(),
            dst: dst.clone(),
            end: DmaEnd::Incoming,
            sem,
            bytes,
            started,
        });
        Ok(())
    }

    /// Add `amount` to semaphore `s` (a signal from another device).
    pub fn remote_signal(&mut self, s: (usize, usize), amount: i64, from: &str) -> Result<()> {
        let b = &self.bufs[s.0];
        if !b.alive || !b.dt.is_sem() {
            bail!(
                DmaRace,
                "a remote signal ({from}) targets semaphore {}, which this device has not allocated (or has released)",
                b.name
            );
        }
        self.sem_add(s, amount);
        Ok(())
    }

    /// `tpu.wait_dma2`: wait until the semaphore has `size(dst)` bytes, retiring DMAs in
    /// flight on it (the one into `dst` first, then in start order); then decrement. With
    /// `other_devices` (other devices may still send), a wait nothing here can satisfy returns
    /// `Ok(false)` (blocked; retry after deliveries) instead of a deadlock.
    pub fn dma_wait(&mut self, sem: &View, dst: &View, other_devices: bool) -> Result<bool> {
        let s = self.sem(sem)?;
        self.live(dst)?;
        let need = (dst.elems() * self.bufs[dst.buf].dt.size()) as i64;
        while self.sem_value(s) < need {
            let pick = self
                .dmas
                .iter()
                .position(|d| d.sem == s && d.dst == *dst)
                .or_else(|| self.dmas.iter().position(|d| d.sem == s));
            let Some(k) = pick else {
                if other_devices {
                    return Ok(false);
                }
                let others: Vec<String> = self
                    .dmas
                    .iter()
                    .map(|d| {
                        format!(
                            "{} → {} on {}",
                            self.describe(&d.src),
                            self.describe(&d.dst),
                            self.sem_name(d.sem)
                        )
                    })
                    .collect();
                bail!(
                    Deadlock,
                    "waits for {need} bytes on DMA semaphore {} (value {}), but no DMA in flight signals it{}; on hardware this hangs",
                    self.sem_name(s),
                    self.sem_value(s),
                    if others.is_empty() {
                        String::new()
                    } else {
                        format!(" (in flight: {})", others.join("; "))
                    }
                );
            };
            let d = self.dmas.remove(k);
            self.sem_add(s, d.bytes);
        }
        self.sem_add(s, -need);
        Ok(true)
    }

    pub fn sem_signal(&mut self, sem: &View, amount: i64) -> Result<()> {
        let s = self.sem(sem)?;
        self.sem_add(s, amount);
        Ok(())
    }

    /// `tpu.sem_wait`; `other_devices` as for [`Memory::dma_wait`].
    pub fn sem_wait(&mut self, sem: &View, amount: i64, other_devices: bool) -> Result<bool> {
        let s = self.sem(sem)?;
        while self.sem_value(s) < amount {
            let Some(k) = self.dmas.iter().position(|d| d.sem == s) else {
                if other_devices {
                    return Ok(false);
                }
                bail!(
                    Deadlock,
                    "waits for {amount} on semaphore {} (value {}), but nothing can signal it any more (no DMA in flight on it, and this is the only core); on hardware this hangs",
                    self.sem_name(s),
                    self.sem_value(s)
                );
            };
            let d = self.dmas.remove(k);
            self.sem_add(s, d.bytes);
        }
        self.sem_add(s, -amount);
        Ok(true)
    }

    // --- scopes -----------------------------------------------------------------------------

    pub fn push_scope(&mut self) {
        self.scopes.push(Vec::new());
    }

    /// End a `tpu.region`: its buffers die; DMAs touching them must be done and its
    /// semaphores back at zero.
    pub fn pop_scope(&mut self) -> Result<()> {
        let ids = self.scopes.pop().unwrap_or_default();
        for &id in &ids {
            self.check_released(id, "the end of its region")?;
        }
        for id in ids {
            let b = &mut self.bufs[id];
            b.alive = false;
            b.data = Arc::new(Data::I(Vec::new()));
            b.lent = Vec::new();
        }
        Ok(())
    }

    /// Buffer `id` is going away at `when`: no DMA may touch it and its semaphores must be 0.
    pub fn check_released(&self, id: usize, when: &str) -> Result<()> {
        for d in &self.dmas {
            if d.dst.buf == id || d.src.buf == id || d.sem.0 == id {
                bail!(
                    Leak,
                    "DMA {} → {} (started by {}) is still in flight at {when}; it was never waited on",
                    self.describe(&d.src),
                    self.describe(&d.dst),
                    d.started
                );
            }
        }
        let b = &self.bufs[id];
        if b.dt.is_sem()
            && let Data::I(v) = &*b.data
            && let Some(k) = v.iter().position(|&x| x != 0)
        {
            bail!(
                Leak,
                "semaphore {} has value {} at {when}; semaphores must be zero when released (unbalanced signal/wait)",
                self.sem_name((id, k)),
                v[k]
            );
        }
        Ok(())
    }
}

pub(crate) fn join<T: std::fmt::Display>(xs: &[T]) -> String {
    xs.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

#[allow(dead_code)]
pub(crate) fn err(kind: ErrorKind, m: String) -> InterpError {
    InterpError::new(kind, m)
}
