//! Read blocks cut into steps, so that writing overlaps reading even when
//! the whole array is one read block; cut only where the seek count, taken
//! in the plan's order, cannot change (see `docs/keep.md`).

use super::dims::DimOption;
use super::problem::Problem;
use crate::array::geometry::Axis;

/// Most steps one read block is cut into.
const MAX_STEPS_PER_READ: u64 = 16;

/// The read blocks cut, along the first dimension, into the *steps* the
/// executor takes: after each step it writes the part of the completed write
/// block before the step's end, so writing overlaps reading even when the
/// plan has one huge read block (a split or merge reads the whole array as
/// one). A read block is cut only where no seek can change, the seeks being
/// counted in the plan's order (a read block's reads, then its write block's
/// writes): at an input boundary, or anywhere when every read interval of
/// the other dimensions lies inside one input (so the cut splits one file's
/// segment into two that continue each other); and likewise at an output
/// boundary, or anywhere when every write interval of the other dimensions
/// lies inside one output. Cuts closer than 1/16 of the read block are
/// skipped, so each step moves enough bytes to pay for its hand-over.
/// An input block read bridged is not cut inside: the two calls would
/// not continue each other across the gap after the first one's last row.
/// (A slab of a padded edge chunk is written with the padding after its
/// last row, so the next continues it: `engine::writer`.)
/// When `problem` reads input blocks whole (encoded inputs), only input
/// boundaries cut, so no step cuts an input block; when it writes output
/// blocks whole (encoded outputs), only output boundaries cut, so each
/// slab handed to the writer holds whole output blocks.
pub(super) fn step_axis(dims: &[&DimOption], problem: &Problem) -> Axis {
    let first = dims[0];
    let reads_in_one_input = !problem.reads_whole_inputs()
        && !problem.bridged.contains(&true)
        && dims[1..].iter().all(|o| o.reads_within_one_input);
    let writes_in_one_output =
        !problem.writes_whole_outputs() && dims[1..].iter().all(|o| o.writes_within_one_output);
    let mut bounds = Vec::with_capacity(first.read.count() + 1);
    for k in 0..first.read.count() {
        let start = first.read.start(k);
        bounds.push(start);
        let spacing = first.read.extent(k).div_ceil(MAX_STEPS_PER_READ).max(1);
        let mut last = start;
        for cut in &first.cuts[k] {
            let neutral = (cut.input_boundary || reads_in_one_input)
                && (cut.output_boundary || writes_in_one_output);
            if neutral && cut.at - last >= spacing {
                bounds.push(cut.at);
                last = cut.at;
            }
        }
    }
    bounds.push(first.read.len());
    Axis::from_bounds(bounds)
}

#[cfg(test)]
mod tests {
    use crate::plan::{keep_rhat, Problem, Strategy};

    #[test]
    fn a_split_is_read_in_steps_at_output_boundaries() {
        // One 350³ u16 file into 50³ blocks: one read block, cut where each
        // row of output blocks ends, so writing starts after 1/7 of it.
        let problem = Problem::new(vec![350; 3], vec![350; 3], vec![50; 3], 2).unwrap();
        let plan = keep_rhat(&problem);
        assert_eq!(plan.read.count(), 1);
        assert_eq!(
            plan.steps.axis(0).bounds(),
            &[0, 50, 100, 150, 200, 250, 300, 350]
        );
        assert_eq!(plan.steps.axis(1).bounds(), &[0, 350]);
        // A step being read beside the slab the last one completed.
        assert_eq!(plan.prediction.peak_bytes, 2 * 50 * 350 * 350 * 2);
        assert_eq!(plan.prediction.seeks(), 344);
        // So the fewest seeks now fit in 30 MB, where reading the whole file
        // at once needed 82 MB and read blocks of one slab cost 350 seeks.
        let tight = crate::plan::plan(&problem, Strategy::Keep, Some(30_000_000)).unwrap();
        assert_eq!(tight.prediction.seeks(), 344);
    }

    #[test]
    fn a_merge_is_read_in_steps_at_input_boundaries() {
        // 350³ in 35³ blocks into one file: cut at every input boundary of
        // the first dimension (the one output spans the rest).
        let problem = Problem::new(vec![350; 3], vec![35; 3], vec![350; 3], 2).unwrap();
        let plan = keep_rhat(&problem);
        let cuts: Vec<u64> = (0..=10).map(|k| k * 35).collect();
        assert_eq!(plan.steps.axis(0).bounds(), &cuts[..]);
        assert_eq!(plan.prediction.peak_bytes, 2 * 35 * 350 * 350 * 2);
        assert_eq!(plan.prediction.seeks(), 1001);
    }

    #[test]
    fn steps_never_cut_where_a_seek_would_change() {
        // W1's shapes: a read interval of 70 holds an input boundary (35)
        // but write intervals span several outputs and read intervals
        // several inputs, so a cut at 35 would interleave output files.
        let problem = Problem::new(vec![700; 3], vec![35; 3], vec![50; 3], 2).unwrap();
        let plan = keep_rhat(&problem);
        assert_eq!(plan.steps.axis(0), plan.read.axis(0));
        // Output blocks one element thick: cuts at most every 1/16 of the
        // read block.
        let problem = Problem::new(vec![64, 8], vec![64, 8], vec![1, 8], 1).unwrap();
        let plan = keep_rhat(&problem);
        assert_eq!(plan.steps.axis(0).count(), 16);
    }
}
