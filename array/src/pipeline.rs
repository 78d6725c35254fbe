//! THE Pallas grid pipeline: which block of each windowed operand is resident at each grid
//! step, when an input block is fetched and when an output block is written back. One model
//! for the interpreter (which copies the blocks), the profile (which times the copies) and
//! autotune's traffic model (which counts their bytes). Each hands the block indices here
//! from the index maps it has: the interpreter runs the emitted Mosaic's `transform_N`
//! functions, the other two evaluate the DSL's index maps with
//! `palladium_dsl::ir::CompiledIndexMap` (this crate depends on no other).
//!
//! The rule, as `pallas_call` runs a grid on a TPU core:
//! - the grid is walked as nested loops in lexicographic order, the last dimension fastest
//!   ([`GridOrder`]); a kernel without a grid is one step at the empty point;
//! - at each step every windowed operand's index map gives its block index;
//! - an input block is copied HBM→VMEM when its index differs from the previous step's
//!   (always at the first step): a block revisited on consecutive steps is fetched once;
//! - an output block stays resident while its index stays the same, and is written back
//!   when the index is about to change and after the last step;
//! - only consecutive steps count: an index that returns to an earlier value after another
//!   fetches (or writes back) that block again.
//!
//! Dimension semantics do not change the rule: `parallel` and `core_parallel` dimensions may
//! be split between cores, each of which runs its part of the grid with a pipeline of its
//! own ([`Pipeline::within`]), so the first step of each part fetches every block again.

/// A block index as the pipeline compares them.
pub trait BlockIndex: Clone + Default {
    /// Whether the block stays resident from a step at `self` to a step at `next`.
    fn same_block(&self, next: &Self) -> bool;
}

impl BlockIndex for Vec<i64> {
    fn same_block(&self, next: &Self) -> bool {
        self == next
    }
}

/// `None` is an index that depends on data the caller does not know (the profile without a
/// scalar-prefetch array's contents): it never equals another, so the copy is assumed made.
impl BlockIndex for Option<Vec<i64>> {
    fn same_block(&self, next: &Self) -> bool {
        matches!((self, next), (Some(a), Some(b)) if a == b)
    }
}

/// Which way a windowed operand's blocks move.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Fetched HBM→VMEM when its block changes.
    Input,
    /// Written back VMEM→HBM when its block is about to change, and after the last step.
    Output,
}

/// The points of a grid in Pallas order (lexicographic, last dimension fastest).
#[derive(Clone, Debug)]
pub struct GridOrder {
    extents: Vec<i64>,
    next: Vec<i64>,
    left: u64,
}

impl GridOrder {
    /// The `extents.iter().product()` points of the grid (one, the empty point, without a
    /// grid; none when an extent is zero).
    pub fn new(extents: &[i64]) -> GridOrder {
        let left = extents.iter().map(|&e| u64::try_from(e).unwrap_or(0)).product();
        GridOrder { extents: extents.to_vec(), next: vec![0; extents.len()], left }
    }

    /// How many points are left.
    pub fn len(&self) -> u64 {
        self.left
    }

    pub fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// The next point, written into `point` (no allocation); false after the last one.
    pub fn next_into(&mut self, point: &mut Vec<i64>) -> bool {
        if self.left == 0 {
            return false;
        }
        point.clone_from(&self.next);
        self.left -= 1;
        for d in (0..self.next.len()).rev() {
            self.next[d] += 1;
            if self.next[d] < self.extents[d] {
                break;
            }
            self.next[d] = 0;
        }
        true
    }
}

impl Iterator for GridOrder {
    type Item = Vec<i64>;

    fn next(&mut self) -> Option<Vec<i64>> {
        let mut p = Vec::new();
        self.next_into(&mut p).then_some(p)
    }
}

/// A windowed operand that takes a new block at a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change<B> {
    /// Its position in the roles given to [`Pipeline::new`].
    pub operand: usize,
    pub role: Role,
    /// The block it holds from this step on: an input's is fetched before the step's body
    /// runs, an output's starts as a fresh window.
    pub block: B,
    /// An output's block held until the previous step, written back now (before `block`
    /// takes the window). `None` for inputs and at an operand's first step.
    pub left: Option<B>,
}

/// One grid step of a [`Pipeline`]: reused from step to step, so a walk does not allocate
/// once its buffers have grown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step<B> {
    /// Its position in the walk (0 for the first step).
    pub index: u64,
    /// The grid indices.
    pub point: Vec<i64>,
    /// The operands whose block changes at this step, in operand order.
    pub changes: Vec<Change<B>>,
}

impl<B> Default for Step<B> {
    fn default() -> Self {
        Step { index: 0, point: Vec::new(), changes: Vec::new() }
    }
}

/// The pipeline over a grid: feed it each step's block indices, it says which blocks move
/// (see the module doc for the rule).
#[derive(Clone, Debug)]
pub struct Pipeline<B> {
    order: GridOrder,
    /// Leading grid indices fixed by [`Pipeline::within`].
    head: Vec<i64>,
    roles: Vec<Role>,
    resident: Vec<Option<B>>,
    /// Each operand's block index at the step being walked (buffers reused).
    now: Vec<B>,
    taken: u64,
    tail: Vec<i64>,
}

impl<B: BlockIndex> Pipeline<B> {
    /// The pipeline over the whole grid `extents`, for windowed operands of the given roles
    /// (the operand numbers of [`Change::operand`] are positions in `roles`).
    pub fn new(extents: &[i64], roles: Vec<Role>) -> Pipeline<B> {
        Pipeline::within(extents, &[], roles)
    }

    /// The pipeline over the points of `extents` whose leading indices are `head`, started
    /// afresh: what one core runs when the leading `head.len()` dimensions are split between
    /// cores.
    pub fn within(extents: &[i64], head: &[i64], roles: Vec<Role>) -> Pipeline<B> {
        let resident = vec![None; roles.len()];
        let now = vec![B::default(); roles.len()];
        Pipeline {
            order: GridOrder::new(&extents[head.len()..]),
            head: head.to_vec(),
            roles,
            resident,
            now,
            taken: 0,
            tail: Vec::new(),
        }
    }

    /// Steps left to walk.
    pub fn steps_left(&self) -> u64 {
        self.order.len()
    }

    /// Walk to the next step: `block_index(operand, point, index)` writes each operand's
    /// block index there into `index` (all of them, in operand order, before anything moves;
    /// `index` holds an earlier step's value, to reuse its buffer), `step` receives the point
    /// and the changes. False (and `step` untouched) after the last step.
    pub fn next_step<E>(
        &mut self,
        step: &mut Step<B>,
        mut block_index: impl FnMut(usize, &[i64], &mut B) -> Result<(), E>,
    ) -> Result<bool, E> {
        if !self.order.next_into(&mut self.tail) {
            return Ok(false);
        }
        step.index = self.taken;
        self.taken += 1;
        step.point.clear();
        step.point.extend_from_slice(&self.head);
        step.point.extend_from_slice(&self.tail);
        step.changes.clear();
        for (operand, now) in self.now.iter_mut().enumerate() {
            block_index(operand, &step.point, now)?;
        }
        for (operand, (now, held)) in self.now.iter_mut().zip(&mut self.resident).enumerate() {
            if held.as_ref().is_some_and(|h| h.same_block(now)) {
                continue;
            }
            // The new block becomes resident; the buffer of the one it replaces is reused.
            let left = held.replace(std::mem::take(now));
            let role = self.roles[operand];
            let block = held.clone().expect("just replaced");
            let left = match (role, left) {
                (Role::Output, Some(l)) => {
                    *now = l.clone();
                    Some(l)
                }
                (_, l) => {
                    *now = l.unwrap_or_default();
                    None
                }
            };
            step.changes.push(Change { operand, role, block, left });
        }
        Ok(true)
    }

    /// After the last step: the output blocks still resident, written back now, in operand
    /// order (each once: the pipeline forgets them).
    pub fn finish(&mut self) -> impl Iterator<Item = (usize, B)> + '_ {
        let roles = &self.roles;
        self.resident
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| roles[*i] == Role::Output)
            .filter_map(|(i, held)| held.take().map(|b| (i, b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Role::{Input, Output};

    /// What a walk does, step by step, as text: `point: fetch x@block, write y@block, ...`
    /// (an output's fresh window is `start`), then the final write-backs.
    fn trace<B: BlockIndex + std::fmt::Debug>(
        mut p: Pipeline<B>,
        mut index: impl FnMut(usize, &[i64]) -> B,
    ) -> Vec<String> {
        let mut step = Step::default();
        let mut lines = Vec::new();
        let mut index = |o: usize, pt: &[i64], b: &mut B| {
            *b = index(o, pt);
            Ok::<_, ()>(())
        };
        while p.next_step(&mut step, &mut index).expect("infallible index") {
            let mut moves = Vec::new();
            for c in &step.changes {
                if let Some(left) = &c.left {
                    moves.push(format!("write {}@{left:?}", c.operand));
                }
                let verb = if c.role == Input { "fetch" } else { "start" };
                moves.push(format!("{verb} {}@{:?}", c.operand, c.block));
            }
            lines.push(format!("{:?}: {}", step.point, moves.join(", ")));
        }
        let last: Vec<String> = p.finish().map(|(o, b)| format!("write {o}@{b:?}")).collect();
        lines.push(format!("end: {}", last.join(", ")));
        lines
    }

    #[test]
    fn grid_order_is_lexicographic_last_dimension_fastest() {
        let points: Vec<Vec<i64>> = GridOrder::new(&[2, 3]).collect();
        assert_eq!(points, [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]);
        assert_eq!(GridOrder::new(&[]).collect::<Vec<_>>(), [Vec::<i64>::new()]);
        assert_eq!(GridOrder::new(&[3, 0]).count(), 0);
        assert_eq!(GridOrder::new(&[4, 5, 6]).len(), 120);
    }

    #[test]
    fn revisited_input_blocks_are_fetched_once_and_outputs_written_when_they_change() {
        // A matmul's reduction: x at (i, k), the output at (i, 0) over grid (i 2, k 2).
        let p = Pipeline::new(&[2, 2], vec![Input, Input, Output]);
        let lines = trace(p, |o, pt| match o {
            0 => vec![pt[0], pt[1]],
            1 => vec![0, 0],
            _ => vec![pt[0], 0],
        });
        assert_eq!(
            lines,
            [
                "[0, 0]: fetch 0@[0, 0], fetch 1@[0, 0], start 2@[0, 0]",
                "[0, 1]: fetch 0@[0, 1]",
                "[1, 0]: fetch 0@[1, 0], write 2@[0, 0], start 2@[1, 0]",
                "[1, 1]: fetch 0@[1, 1]",
                "end: write 2@[1, 0]",
            ]
        );
    }

    #[test]
    fn the_last_step_writes_back_every_resident_output_once() {
        // One output at a constant block: written back once, after the last step.
        let mut p = Pipeline::new(&[3], vec![Output, Output]);
        let lines = trace(p.clone(), |o, pt| vec![if o == 0 { 0 } else { pt[0] }]);
        assert_eq!(
            lines,
            [
                "[0]: start 0@[0], start 1@[0]",
                "[1]: write 1@[0], start 1@[1]",
                "[2]: write 1@[1], start 1@[2]",
                "end: write 0@[0], write 1@[2]",
            ]
        );
        // Nothing walked, nothing resident: nothing to write.
        assert_eq!(p.finish().count(), 0);
    }

    #[test]
    fn a_block_index_that_returns_to_an_earlier_value_moves_again() {
        let p = Pipeline::new(&[4], vec![Input, Output]);
        let blocks = [0, 1, 0, 0];
        let lines = trace(p, |_, pt| vec![blocks[pt[0] as usize]]);
        assert_eq!(
            lines,
            [
                "[0]: fetch 0@[0], start 1@[0]",
                "[1]: fetch 0@[1], write 1@[0], start 1@[1]",
                "[2]: fetch 0@[0], write 1@[1], start 1@[0]",
                "[3]: ",
                "end: write 1@[0]",
            ]
        );
    }

    #[test]
    fn scalar_prefetch_contents_drive_the_blocks() {
        // A gather: x's block is ids[i] (scalar prefetch), the output's is i.
        let ids = [3, 3, 1, 3];
        let p = Pipeline::new(&[4], vec![Input, Output]);
        let lines = trace(p, |o, pt| vec![if o == 0 { ids[pt[0] as usize] } else { pt[0] }]);
        assert_eq!(
            lines,
            [
                "[0]: fetch 0@[3], start 1@[0]",
                "[1]: write 1@[0], start 1@[1]",
                "[2]: fetch 0@[1], write 1@[1], start 1@[2]",
                "[3]: fetch 0@[3], write 1@[2], start 1@[3]",
                "end: write 1@[3]",
            ]
        );
    }

    #[test]
    fn unknown_block_indices_always_move() {
        // ids unknown at steps 1 and 2: fetched at each, and at the known step after them.
        let p = Pipeline::new(&[4], vec![Input]);
        let lines = trace(p, |_, pt| (pt[0] != 1 && pt[0] != 2).then(|| vec![0]));
        assert_eq!(
            lines,
            [
                "[0]: fetch 0@Some([0])",
                "[1]: fetch 0@None",
                "[2]: fetch 0@None",
                "[3]: fetch 0@Some([0])",
                "end: ",
            ]
        );
    }

    #[test]
    fn multi_axis_grids_and_parallel_parts() {
        // Grid (2, 2, 2): y at (j, 0) only changes with the middle axis.
        let index = |o: usize, pt: &[i64]| match o {
            0 => vec![pt[1], 0],
            _ => vec![pt[0], pt[1]],
        };
        let p = Pipeline::new(&[2, 2, 2], vec![Input, Output]);
        let lines = trace(p, index);
        assert_eq!(
            lines,
            [
                "[0, 0, 0]: fetch 0@[0, 0], start 1@[0, 0]",
                "[0, 0, 1]: ",
                "[0, 1, 0]: fetch 0@[1, 0], write 1@[0, 0], start 1@[0, 1]",
                "[0, 1, 1]: ",
                "[1, 0, 0]: fetch 0@[0, 0], write 1@[0, 1], start 1@[1, 0]",
                "[1, 0, 1]: ",
                "[1, 1, 0]: fetch 0@[1, 0], write 1@[1, 0], start 1@[1, 1]",
                "[1, 1, 1]: ",
                "end: write 1@[1, 1]",
            ]
        );
        // The part of a core that runs i = 1: its own pipeline, fresh at its first step.
        let part = Pipeline::within(&[2, 2, 2], &[1], vec![Input, Output]);
        assert_eq!(part.steps_left(), 4);
        let lines = trace(part, index);
        assert_eq!(lines[0], "[1, 0, 0]: fetch 0@[0, 0], start 1@[1, 0]");
        assert_eq!(lines.len(), 5);
    }

    #[test]
    fn an_error_from_an_index_map_stops_the_walk() {
        let mut p: Pipeline<Vec<i64>> = Pipeline::new(&[3], vec![Input]);
        let mut step = Step::default();
        let index = |_: usize, pt: &[i64], b: &mut Vec<i64>| {
            *b = vec![pt[0]];
            if pt[0] == 1 { Err("bad") } else { Ok(()) }
        };
        assert_eq!(p.next_step(&mut step, index), Ok(true));
        assert_eq!(p.next_step(&mut step, index), Err("bad"));
        assert_eq!(step.point, [1]);
    }
}
