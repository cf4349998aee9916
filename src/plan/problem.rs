//! What is to be rechunked, checked once where it comes in, so that the
//! planner can count on shapes that agree, are positive and fit the array.

use serde::Serialize;

use super::dims::{DimOption, WriteMode};
use crate::array::geometry::{self, Axis, FileShape, Partition, Region};
use crate::error::{Error, Result};

/// The array and its two block shapes: what is to be rechunked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub array: Vec<u64>,
    pub input_block: Vec<u64>,
    pub output_block: Vec<u64>,
    /// Bytes per element.
    pub elem_size: u64,
    /// How input files are shaped around their blocks (Zarr pads edge chunks).
    pub input_files: FileShape,
    /// How output files are shaped around their blocks.
    pub output_files: FileShape,
    /// Whether each output block is encoded (compressed, sharded) and so
    /// written whole, in one call, from a copy gathered in memory.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub encoded_outputs: bool,
    /// Where `array` lies in the whole array (all 0 but for a part of a
    /// job, [`Problem::part`]): block boundaries are the whole array's.
    pub origin: Vec<u64>,
    /// The whole array's shape (`array` but for a part).
    pub whole: Vec<u64>,
    /// Per dimension: whether an input block this problem's array clips
    /// there is read as if its file held just the clipped box, each run
    /// of its rows in one call that reads the rows of the neighbouring
    /// parts between them and drops them ([`Problem::read_window`]): one
    /// seek where rows would cost one each, for the bytes between.
    #[serde(skip_serializing_if = "no_bridges")]
    pub bridged: Vec<bool>,
    /// Threads that decode input blocks and encode output blocks at once
    /// (at least 1): each holds its block, so the peak counts them all.
    #[serde(skip)]
    pub workers: usize,
}

fn no_bridges(bridged: &[bool]) -> bool {
    !bridged.contains(&true)
}

/// Output blocks the encoders hold at once ([`Problem::encoder_slots`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncoderSlots {
    /// Blocks gathered and being encoded: one per worker.
    pub encoding: u64,
    /// Blocks encoded and waiting for their turn to be written.
    pub waiting: u64,
}

impl EncoderSlots {
    /// Blocks handed to the encoders and not yet written, at most.
    pub fn blocks(self) -> u64 {
        self.encoding + self.waiting
    }
}

impl Problem {
    /// Checks the shapes agree and are positive; block shapes larger than the
    /// array are clipped to it (`--shape` may exceed the array to mean "whole").
    pub fn new(
        array: Vec<u64>,
        input_block: Vec<u64>,
        output_block: Vec<u64>,
        elem_size: u64,
    ) -> Result<Problem> {
        check_shapes(&array, &input_block, &output_block)?;
        let clip = |block: Vec<u64>| -> Vec<u64> {
            block.iter().zip(&array).map(|(&b, &a)| b.min(a)).collect()
        };
        Ok(Problem {
            input_block: clip(input_block),
            output_block: clip(output_block),
            origin: vec![0; array.len()],
            whole: array.clone(),
            bridged: vec![false; array.len()],
            array,
            elem_size,
            input_files: FileShape::Exact,
            output_files: FileShape::Exact,
            encoded_outputs: false,
            workers: 1,
        })
    }

    /// The same problem with `workers` threads decoding and encoding
    /// blocks at once (at least 1).
    pub fn with_workers(mut self, workers: usize) -> Problem {
        self.workers = workers.max(1);
        self
    }

    /// Blocks of a batch of `count` decoded or encoded at once.
    pub(super) fn batch(&self, count: u64) -> u64 {
        count.min(self.workers as u64)
    }

    /// The same problem with input and output files shaped as given: a
    /// padded file's rows are longer than its block's, which changes which
    /// pieces are contiguous, so the seek predictions depend on it.
    pub fn with_files(mut self, input_files: FileShape, output_files: FileShape) -> Problem {
        self.input_files = input_files;
        self.output_files = output_files;
        self
    }

    /// The same problem with every output block encoded whole (compressed
    /// or sharded): the plan must then hand each output block to the writer
    /// in one piece of work, and the writer holds the block and its encoding.
    pub fn with_encoded_outputs(mut self) -> Problem {
        self.encoded_outputs = true;
        self
    }

    /// Whether output blocks are written whole (see [`with_encoded_outputs`](Self::with_encoded_outputs)):
    /// write intervals then follow read intervals in keep mode only, and
    /// steps cut read blocks only at output boundaries.
    pub(super) fn writes_whole_outputs(&self) -> bool {
        self.encoded_outputs
    }

    /// Bytes the writer holds while it writes one encoded output block: the
    /// block gathered whole (as large as its file's array, padding
    /// included) and its encoding, counted at the same size, which a codec
    /// exceeds only on incompressible data, by its framing (0 unless
    /// outputs are encoded).
    pub fn encoding_bytes(&self) -> u64 {
        if !self.encoded_outputs {
            return 0;
        }
        let volume: u128 = (0..self.ndim())
            .map(|d| self.output_files.file_extent(d, self.output_block[d]) as u128)
            .product();
        u64::try_from(2 * volume * self.elem_size as u128).unwrap_or(u64::MAX)
    }

    /// Output blocks the encoders may hold at once (encoded outputs): one
    /// being gathered and encoded per worker, and, with more than one
    /// worker, as many again encoded and waiting for the blocks before them
    /// to be written, so that a worker done before the block ahead of its
    /// own is written goes on with the next; never more than there are
    /// output blocks.
    pub fn encoder_slots(&self) -> EncoderSlots {
        let blocks = self.output().count();
        let encoding = self.batch(blocks);
        let waiting = if self.workers > 1 {
            self.batch(blocks - encoding)
        } else {
            0
        };
        EncoderSlots { encoding, waiting }
    }

    /// Bytes the encoders may hold at once ([`encoder_slots`](Self::encoder_slots)):
    /// a block being encoded holds [`encoding_bytes`](Self::encoding_bytes),
    /// a block waiting to be written its encoding, half that.
    pub fn encoders_bytes(&self) -> u64 {
        let slots = self.encoder_slots();
        let per_block = self.encoding_bytes();
        per_block
            .saturating_mul(slots.encoding)
            .saturating_add((per_block / 2).saturating_mul(slots.waiting))
    }

    /// The part `region` of this problem's array (a box of whole output
    /// blocks, in this array's coordinates): the same rechunk restricted
    /// to it, its input blocks clipped to it. Clipped input blocks keep
    /// their files, so a read of one is a part of a longer file: the
    /// planner counts its seeks as such.
    pub fn part(&self, region: &Region) -> Problem {
        let mut part = self.clone();
        part.origin = (0..self.ndim())
            .map(|d| self.origin[d] + region.origin[d])
            .collect();
        part.array = region.shape.clone();
        part
    }

    /// The same problem reading the input blocks it clips in the
    /// dimensions `bridged` says as if their files held just the clipped
    /// box (see the field). Encoded inputs are read whole anyway.
    pub fn with_bridged(mut self, bridged: Vec<bool>) -> Problem {
        if bridged.len() == self.ndim() && !self.reads_whole_inputs() {
            self.bridged = bridged;
        }
        self
    }

    /// The box of an input block's file (`file_box`, holding `block`, both
    /// in the whole array's coordinates) whose runs of rows the reads
    /// follow, in the file's coordinates: the whole file, but in bridged
    /// dimensions the part of the block inside this problem's array.
    pub fn read_window(&self, block: &Region, file_box: &Region) -> Region {
        let (origin, shape) = (0..self.ndim())
            .map(|d| {
                if !self.bridged[d] {
                    return (0, file_box.shape[d]);
                }
                let start = block.origin[d].max(self.origin[d]);
                let end = block.end(d).min(self.origin[d] + self.array[d]);
                (start - file_box.origin[d], end.saturating_sub(start))
            })
            .unzip();
        Region::new(origin, shape)
    }

    /// The whole array's regular intervals of `step` along dimension `d`,
    /// as they cut this problem's array (its coordinates).
    pub fn axis_of(&self, d: usize, step: u64) -> Axis {
        let (origin, len) = (self.origin[d], self.array[d]);
        let mut bounds = vec![0];
        let mut boundary = (origin / step + 1) * step;
        while boundary < origin + len {
            bounds.push(boundary - origin);
            boundary += step;
        }
        bounds.push(len);
        Axis::from_bounds(bounds)
    }

    /// Per input interval along dimension `d`: its file's extent there
    /// (the whole input block's, which a part may clip).
    pub(super) fn input_file_extents(&self, d: usize, input: &Axis) -> Vec<u64> {
        let step = self.input_block[d];
        (0..input.count())
            .map(|f| {
                let start = (self.origin[d] + input.start(f)) / step * step;
                let extent = step.min(self.whole[d] - start);
                self.input_files.file_extent(d, extent)
            })
            .collect()
    }

    /// Per input interval along dimension `d`: the extent of the window
    /// its reads follow ([`Problem::read_window`]): the file's, or in a
    /// bridged dimension the interval's own.
    pub(super) fn input_window_extents(&self, d: usize, input: &Axis) -> Vec<u64> {
        if self.bridged[d] {
            return (0..input.count()).map(|f| input.extent(f)).collect();
        }
        self.input_file_extents(d, input)
    }

    /// The options for dimension `d`: read intervals of `read_step`, writes following them in `mode`.
    pub(super) fn dim_option(
        &self,
        d: usize,
        input: &Partition,
        output: &Partition,
        read_step: u64,
        mode: WriteMode,
    ) -> DimOption {
        let files = self.input_file_extents(d, input.axis(d));
        let windows = self.input_window_extents(d, input.axis(d));
        let outputs = output.axis(d);
        let output_files: Vec<u64> = (0..outputs.count())
            .map(|f| self.output_files.file_extent(d, outputs.extent(f)))
            .collect();
        DimOption::new(
            self.axis_of(d, read_step),
            (input.axis(d), &windows, &files),
            (outputs, &output_files),
            read_step,
            mode,
        )
    }

    /// Per dimension: whether one input file spans it exactly (a single
    /// block, neither padded nor clipped), so C-order neighbours across it
    /// are neighbours in that file too.
    pub(super) fn input_spans_exactly(&self, input: &Partition) -> Vec<bool> {
        (0..self.ndim())
            .map(|d| {
                input.axis(d).count() == 1
                    && self.input_file_extents(d, input.axis(d))[0] == self.array[d]
            })
            .collect()
    }

    /// Whether input blocks can only be read whole (encoded files): read
    /// intervals are then whole numbers of input blocks, and steps cut
    /// read blocks only at input boundaries.
    pub(super) fn reads_whole_inputs(&self) -> bool {
        self.input_files.is_encoded()
    }

    /// Bytes of the smallest decoded input block (0 unless inputs are
    /// encoded): every step holds at least that beside it.
    pub(super) fn least_decoded_block_bytes(&self) -> u128 {
        self.decoded_block_bytes(Iterator::min)
    }

    /// Bytes of the largest decoded input block (0 unless inputs are
    /// encoded): the most a step holds beside it.
    pub(super) fn largest_decoded_block_bytes(&self) -> u128 {
        self.decoded_block_bytes(Iterator::max)
    }

    /// The decoded input block whose extent `pick` picks along each
    /// dimension, in bytes (input blocks are a product of intervals).
    fn decoded_block_bytes(&self, pick: fn(std::vec::IntoIter<u128>) -> Option<u128>) -> u128 {
        if !self.input_files.is_encoded() {
            return 0;
        }
        let input = self.input();
        (0..self.ndim())
            .map(|d| {
                let files = input.axis(d);
                let extents: Vec<u128> = (0..files.count())
                    .map(|f| self.input_files.file_extent(d, files.extent(f)) as u128)
                    .collect();
                pick(extents.into_iter()).unwrap_or(0)
            })
            .product::<u128>()
            * self.elem_size as u128
    }

    pub fn ndim(&self) -> usize {
        self.array.len()
    }

    /// The input blocks, as the whole array's cut this problem's array.
    pub fn input(&self) -> Partition {
        Partition::new(
            (0..self.ndim())
                .map(|d| self.axis_of(d, self.input_block[d]))
                .collect(),
        )
    }

    /// The output blocks, as the whole array's cut this problem's array.
    pub fn output(&self) -> Partition {
        Partition::new(
            (0..self.ndim())
                .map(|d| self.axis_of(d, self.output_block[d]))
                .collect(),
        )
    }

    /// `r̂`: per dimension the smallest multiple of the input block that
    /// covers an output block, clipped to the whole array.
    pub fn rhat(&self) -> Vec<u64> {
        (0..self.ndim())
            .map(|d| {
                let i = self.input_block[d];
                (i * self.output_block[d].div_ceil(i)).min(self.whole[d])
            })
            .collect()
    }

    /// `n_I + n_O`: every input block read whole and every output block
    /// written whole, once. (With padded input files an edge block cannot
    /// be one segment, so no plan reaches it then; padded output files are
    /// written whole, their padding filled.)
    pub fn lower_bound_seeks(&self) -> u64 {
        self.input().count() + self.output().count()
    }
}

/// Refuses an array of no dimensions or more than rechunkfs handles, block
/// shapes of another rank than the array's, and any length of 0.
fn check_shapes(array: &[u64], input_block: &[u64], output_block: &[u64]) -> Result<()> {
    let n = array.len();
    if n == 0 || n > geometry::MAX_DIMS {
        return Err(Error::BadArgument(format!(
            "the array has {n} dimensions; rechunkfs handles 1 to {}",
            geometry::MAX_DIMS
        )));
    }
    for (what, shape) in [("input block", input_block), ("output block", output_block)] {
        if shape.len() != n {
            return Err(Error::BadArgument(format!(
                "the {what} shape {} has {} dimensions but the array {} has {n}",
                geometry::show_shape(shape),
                shape.len(),
                geometry::show_shape(array),
            )));
        }
    }
    if array.contains(&0) || input_block.contains(&0) || output_block.contains(&0) {
        return Err(Error::BadArgument(
            "shapes must be positive in every dimension (a 0 was given)".into(),
        ));
    }
    Ok(())
}
