//! Geometry of N-dimensional arrays in C order: boxes ([`Region`]), 1-D
//! partitions of an axis ([`Axis`]), product grids of them ([`Partition`]),
//! and how many contiguous file segments a box occupies ([`runs`]).
//!
//! Everything here is pure arithmetic on coordinates; no I/O. Input blocks,
//! output blocks, read blocks and write blocks are all [`Partition`]s of the
//! same array, so one set of tools serves the planner and the executor.

use std::ops::Range;

/// The most dimensions an array may have (numpy's limit is 32; block-file
/// naming and people's patience are the real limits).
pub const MAX_DIMS: usize = 8;

/// Number of elements in a box of this shape.
pub fn volume(shape: &[u64]) -> u64 {
    shape.iter().product()
}

/// C-order element strides of an array of this shape (last dimension fastest).
pub fn strides(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// C-order linear offset of `coords` in an array of shape with `strides`.
pub fn linear_offset(coords: &[u64], strides: &[u64]) -> u64 {
    coords.iter().zip(strides).map(|(c, s)| c * s).sum()
}

/// Formats a shape as `770×605×700`.
pub fn show_shape(shape: &[u64]) -> String {
    shape
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join("×")
}

/// A half-open box `[origin, origin + shape)` in array coordinates.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    pub origin: Vec<u64>,
    pub shape: Vec<u64>,
}

impl Region {
    pub fn new(origin: Vec<u64>, shape: Vec<u64>) -> Region {
        debug_assert_eq!(origin.len(), shape.len());
        Region { origin, shape }
    }

    /// The box covering a whole array of this shape.
    pub fn whole(shape: &[u64]) -> Region {
        Region::new(vec![0; shape.len()], shape.to_vec())
    }

    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    pub fn end(&self, d: usize) -> u64 {
        self.origin[d] + self.shape[d]
    }

    pub fn volume(&self) -> u64 {
        volume(&self.shape)
    }

    /// The common part of two boxes, `None` when they do not overlap.
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        let mut origin = Vec::with_capacity(self.ndim());
        let mut shape = Vec::with_capacity(self.ndim());
        for d in 0..self.ndim() {
            let start = self.origin[d].max(other.origin[d]);
            let end = self.end(d).min(other.end(d));
            if start >= end {
                return None;
            }
            origin.push(start);
            shape.push(end - start);
        }
        Some(Region::new(origin, shape))
    }

    /// This box expressed relative to `base`'s origin (which must contain it).
    pub fn relative_to(&self, base: &Region) -> Region {
        let origin = self
            .origin
            .iter()
            .zip(&base.origin)
            .map(|(o, b)| o - b)
            .collect();
        Region::new(origin, self.shape.clone())
    }
}

/// How the file of a block is shaped around the block's part of the array.
///
/// Most formats store exactly the block, so an edge block's file is
/// smaller. Zarr stores every chunk at the full chunk shape: an edge chunk's
/// file is padded past the array's end, and its rows are as long as a whole
/// chunk's; so are TIFF tiles. Offsets inside a file, and so which pieces
/// of it are contiguous, follow the file's shape, not the block's. A
/// block's "file" is where its bytes are: several blocks may lie in one
/// real file (TIFF pages, strips and tiles), each read as if alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileShape {
    /// Each file holds exactly its block.
    #[default]
    Exact,
    /// Every file holds a full chunk of this shape, edge chunks padded.
    Padded(Vec<u64>),
    /// Every file is one encoded value (a compressed or sharded chunk, a
    /// gzipped NIfTI image, a compressed TIFF strip or tile), read whole, in
    /// one call, never in parts, that decodes into a full chunk of
    /// `padded_to`, edge chunks padded (Zarr, TIFF), or with `None` into
    /// exactly its block.
    Encoded { padded_to: Option<Vec<u64>> },
}

impl FileShape {
    /// The full chunk every file is padded to, if files are padded.
    fn padded_chunk(&self) -> Option<&[u64]> {
        match self {
            FileShape::Padded(chunk)
            | FileShape::Encoded {
                padded_to: Some(chunk),
            } => Some(chunk),
            FileShape::Exact | FileShape::Encoded { padded_to: None } => None,
        }
    }

    /// The file's box for `block`: same origin, the file's shape.
    pub fn file_box(&self, block: &Region) -> Region {
        match self.padded_chunk() {
            None => block.clone(),
            Some(chunk) => Region::new(
                block.origin.clone(),
                chunk
                    .iter()
                    .zip(&block.shape)
                    .map(|(&c, &b)| c.max(b))
                    .collect(),
            ),
        }
    }

    /// Along dimension `d`, the file's extent for a block `extent` long.
    pub fn file_extent(&self, d: usize, extent: u64) -> u64 {
        self.padded_chunk()
            .map_or(extent, |chunk| chunk[d].max(extent))
    }

    pub fn is_padded(&self) -> bool {
        self.padded_chunk().is_some()
    }

    /// Whether files are read whole and decoded ([`FileShape::Encoded`]).
    pub fn is_encoded(&self) -> bool {
        matches!(self, FileShape::Encoded { .. })
    }
}

/// Number of contiguous segments the box `region` occupies in a C-order file
/// holding a block of shape `block` (region relative to the block's origin):
/// `prod(extent[d] for d < q)`, where `q` is the smallest dimension such that
/// the region spans the whole block in every dimension after `q`.
pub fn runs(region_shape: &[u64], block: &[u64]) -> u64 {
    let q = first_spanning_tail(region_shape, block);
    region_shape[..q].iter().product()
}

/// The `q` of [`runs`]: dimensions `q+1..` are spanned whole, so one segment
/// covers `region[q..]`.
pub fn first_spanning_tail(region_shape: &[u64], block: &[u64]) -> usize {
    let mut q = region_shape.len().saturating_sub(1);
    while q > 0 && region_shape[q] == block[q] {
        q -= 1;
    }
    q
}

/// A partition of `[0, len)` into consecutive non-empty intervals.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Axis {
    /// `bounds[0] == 0`, strictly increasing, last == len.
    bounds: Vec<u64>,
}

impl Axis {
    /// Intervals of `step` from 0, the last one shorter if `step` does not divide `len`.
    pub fn regular(len: u64, step: u64) -> Axis {
        debug_assert!(len > 0 && step > 0);
        let mut bounds: Vec<u64> = (0..len).step_by(step as usize).collect();
        bounds.push(len);
        Axis { bounds }
    }

    /// From boundaries `0 = b0 < b1 < ... < len`; repeated boundaries (empty
    /// intervals) are dropped.
    pub fn from_bounds(mut bounds: Vec<u64>) -> Axis {
        bounds.dedup();
        debug_assert!(bounds.len() >= 2 && bounds[0] == 0);
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Axis { bounds }
    }

    pub fn len(&self) -> u64 {
        self.bounds[self.bounds.len() - 1]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of intervals.
    pub fn count(&self) -> usize {
        self.bounds.len() - 1
    }

    pub fn bounds(&self) -> &[u64] {
        &self.bounds
    }

    pub fn start(&self, i: usize) -> u64 {
        self.bounds[i]
    }

    pub fn end(&self, i: usize) -> u64 {
        self.bounds[i + 1]
    }

    pub fn extent(&self, i: usize) -> u64 {
        self.bounds[i + 1] - self.bounds[i]
    }

    /// Index of the interval holding coordinate `x` (< len).
    pub fn locate(&self, x: u64) -> usize {
        self.bounds.partition_point(|&b| b <= x) - 1
    }

    /// Indices of the intervals overlapping `[start, end)` (non-empty).
    pub fn overlapping(&self, start: u64, end: u64) -> Range<usize> {
        self.locate(start)..self.locate(end - 1) + 1
    }

    /// Whether `x` is a boundary between two intervals (or an end).
    pub fn is_boundary(&self, x: u64) -> bool {
        self.bounds.binary_search(&x).is_ok()
    }
}

/// A product of one [`Axis`] per dimension: a grid of boxes covering the
/// array, visited in C order (last index fastest).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Partition {
    axes: Vec<Axis>,
}

impl Partition {
    pub fn new(axes: Vec<Axis>) -> Partition {
        Partition { axes }
    }

    /// The regular grid of `block`-shaped boxes over `array` (edge boxes smaller).
    pub fn regular(array: &[u64], block: &[u64]) -> Partition {
        Partition::new(
            array
                .iter()
                .zip(block)
                .map(|(&len, &step)| Axis::regular(len, step))
                .collect(),
        )
    }

    pub fn ndim(&self) -> usize {
        self.axes.len()
    }

    pub fn axes(&self) -> &[Axis] {
        &self.axes
    }

    pub fn axis(&self, d: usize) -> &Axis {
        &self.axes[d]
    }

    pub fn array_shape(&self) -> Vec<u64> {
        self.axes.iter().map(Axis::len).collect()
    }

    /// Number of boxes along each dimension.
    pub fn grid_shape(&self) -> Vec<usize> {
        self.axes.iter().map(Axis::count).collect()
    }

    /// Total number of boxes.
    pub fn count(&self) -> u64 {
        self.axes.iter().map(|a| a.count() as u64).product()
    }

    /// The box at grid index `index`.
    pub fn block(&self, index: &[usize]) -> Region {
        let origin = index
            .iter()
            .zip(&self.axes)
            .map(|(&i, a)| a.start(i))
            .collect();
        let shape = index
            .iter()
            .zip(&self.axes)
            .map(|(&i, a)| a.extent(i))
            .collect();
        Region::new(origin, shape)
    }

    /// C-order rank of a grid index.
    pub fn linear(&self, index: &[usize]) -> u64 {
        index
            .iter()
            .zip(&self.axes)
            .fold(0u64, |acc, (&i, a)| acc * a.count() as u64 + i as u64)
    }

    /// Grid index of a C-order rank.
    pub fn unravel(&self, mut rank: u64) -> Vec<usize> {
        let mut index = vec![0usize; self.ndim()];
        for d in (0..self.ndim()).rev() {
            let n = self.axes[d].count() as u64;
            index[d] = (rank % n) as usize;
            rank /= n;
        }
        index
    }

    /// Per dimension, the grid indices whose boxes overlap `region`.
    pub fn overlapping(&self, region: &Region) -> Vec<Range<usize>> {
        (0..self.ndim())
            .map(|d| self.axes[d].overlapping(region.origin[d], region.end(d)))
            .collect()
    }
}

/// Visits every index of a box of grid indices (one range per dimension) in
/// C order: an odometer.
#[derive(Clone, Debug)]
pub struct IndexBox {
    ranges: Vec<Range<usize>>,
    next: Option<Vec<usize>>,
}

impl IndexBox {
    pub fn new(ranges: Vec<Range<usize>>) -> IndexBox {
        let next = if ranges.iter().all(|r| r.start < r.end) {
            Some(ranges.iter().map(|r| r.start).collect())
        } else {
            None
        };
        IndexBox { ranges, next }
    }

    /// All indices of a grid of this shape.
    pub fn grid(shape: &[usize]) -> IndexBox {
        IndexBox::new(shape.iter().map(|&n| 0..n).collect())
    }
}

impl Iterator for IndexBox {
    type Item = Vec<usize>;

    fn next(&mut self) -> Option<Vec<usize>> {
        let current = self.next.take()?;
        let mut following = current.clone();
        for d in (0..following.len()).rev() {
            following[d] += 1;
            if following[d] < self.ranges[d].end {
                self.next = Some(following);
                return Some(current);
            }
            following[d] = self.ranges[d].start;
        }
        Some(current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_follow_the_convention() {
        assert_eq!(runs(&[4, 4, 4], &[4, 4, 4]), 1);
        assert_eq!(runs(&[2, 4, 4], &[4, 4, 4]), 1);
        assert_eq!(runs(&[2, 3, 4], &[4, 4, 4]), 2);
        assert_eq!(runs(&[2, 3, 1], &[4, 4, 4]), 6);
        assert_eq!(runs(&[3, 3, 1], &[3, 3, 3]), 9);
        assert_eq!(runs(&[5], &[9]), 1);
    }

    #[test]
    fn axes_and_partitions() {
        let axis = Axis::regular(10, 4);
        assert_eq!(axis.bounds(), &[0, 4, 8, 10]);
        assert_eq!(axis.locate(7), 1);
        assert_eq!(axis.locate(8), 2);
        assert_eq!(axis.overlapping(3, 9), 0..3);
        let grid = Partition::regular(&[10, 6], &[4, 3]);
        assert_eq!(grid.grid_shape(), vec![3, 2]);
        assert_eq!(grid.block(&[2, 1]), Region::new(vec![8, 3], vec![2, 3]));
        assert_eq!(grid.linear(&[2, 1]), 5);
        assert_eq!(grid.unravel(5), vec![2, 1]);
        let all: Vec<_> = IndexBox::grid(&[2, 2]).collect();
        assert_eq!(all, vec![vec![0, 0], vec![0, 1], vec![1, 0], vec![1, 1]]);
        assert_eq!(IndexBox::new(vec![0..2, 1..1]).count(), 0);
    }
}
