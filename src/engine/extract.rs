//! One output block's bytes on demand, read straight from the inputs ahead
//! of the plan: the view serves a block a reader asks for before the plan
//! reaches it.

use std::fs::{File, Metadata};
use std::io::IoSliceMut;

use super::inputs::{
    count_as_contiguous, decoded_block, read_ahead_input, read_hdf5_pieces, unchanged, unchecked,
    InputHandle, InputWitness,
};
use super::pieces::{InFile, PieceGrid, PieceTarget, RowLayout, SharedPieces};
use super::seekio::{self, FileKey, SeekCounter, SeekLog};
use super::workers::map_on;
use crate::array::geometry::{Axis, IndexBox, Partition, Region};
use crate::error::{Error, Result};
use crate::format::Storage;
use crate::input::{InputArray, InputBlock};
use crate::sys::files::open_regular_with_metadata;

/// Reads `region` of the whole array into `dest`, a C-order buffer of the
/// region's shape, straight from the input blocks it overlaps: one read
/// per input block (the span of its part), counted in `counter` in C order
/// of the blocks, each input told to `witness` first; an absent chunk is
/// filled in memory, nothing read or counted. Up to `threads` blocks are
/// read (and decoded) at once, each into its own part of `dest`; blocks
/// read through libhdf5 go one at a time, under its lock. For extracting
/// one output block ahead of the plan. An input whose file changes while
/// its part is read
/// ([`Error::InputChanged`](crate::error::Error::InputChanged)) fails the
/// extraction: the region would mix two versions of it.
///
/// Returns the most bytes it can have held beside `dest` at once: its
/// parts' buffers (a part's span, or a decoded block and its encoding),
/// the largest as many as were read at once, never above `threads` ×
/// [`region_read_bytes`].
pub fn read_region(
    input: &InputArray,
    region: &Region,
    dest: &mut Vec<u8>,
    counter: &mut SeekCounter,
    witness: Option<&dyn InputWitness>,
    threads: usize,
) -> Result<u64> {
    let inputs = input.grid();
    let elem = input.dtype.size as u64;
    let grid = PieceGrid::new(&cut_at(region, &input.shape), region);
    let cells: Vec<Vec<usize>> = IndexBox::new(inputs.overlapping(region))
        .filter(|cell| inputs.block(cell).intersect(region).is_some())
        .collect();
    let extraction = Extraction {
        input,
        inputs: &inputs,
        elem,
        grid: &grid,
        witness,
    };
    let by_library = cells.iter().any(|cell| {
        let block = &input.blocks[inputs.linear(cell) as usize];
        matches!(block.storage, Storage::Hdf5Dataset { .. })
    });
    let at_once = match by_library {
        true => 1,
        false => threads.clamp(1, cells.len().max(1)),
    };
    let parts: Vec<PartRead> = if at_once == 1 {
        let buffers = std::slice::from_mut(dest);
        cells
            .iter()
            .map(|cell| extraction.read_part_here(cell, buffers))
            .collect::<Result<_>>()?
    } else {
        let shared = SharedPieces::new(&grid, std::slice::from_mut(dest), (&inputs, &cells), elem)?;
        let indexed: Vec<(usize, &Vec<usize>)> = cells.iter().enumerate().collect();
        map_on(at_once, &indexed, |(k, cell)| {
            let mut target = shared.claim(*k)?;
            extraction.read_claimed(cell, &mut target)
        })
        .into_iter()
        .collect::<Result<_>>()?
    };
    let mut held = Vec::with_capacity(parts.len());
    for mut part in parts {
        part.reads.replay_into(counter);
        held.push(part.held);
    }
    held.sort_unstable_by(|a, b| b.cmp(a));
    Ok(held.iter().take(at_once).sum())
}

/// The most bytes [`read_region`] can hold beside its destination, for any
/// region of `input`: the largest of its input blocks' buffers (a
/// contiguous block's whole data, as the span of a part can be; an encoded
/// block decoded, with its encoding). Blocks read through libhdf5 are read
/// straight into the destination; absent ones hold nothing.
pub fn region_read_bytes(input: &InputArray) -> u64 {
    let grid = input.grid();
    let elem = input.dtype.size as u64;
    let mut most = 0;
    for (rank, block) in input.blocks.iter().enumerate() {
        let decoded = || {
            let file_box = input
                .files
                .file_box(&grid.block(&grid.unravel(rank as u64)));
            file_box.volume() * elem
        };
        let held = match &block.storage {
            Storage::Absent { .. } | Storage::Hdf5Dataset { .. } => 0,
            Storage::Contiguous { .. } => decoded(),
            Storage::Encoded { len, .. } => decoded() + len,
        };
        most = most.max(held);
    }
    most
}

/// The array cut at `region`'s bounds, in an array of `shape`: its one
/// cell inside the region is the one piece the region is read into.
fn cut_at(region: &Region, shape: &[u64]) -> Partition {
    Partition::new(
        (0..region.ndim())
            .map(|d| Axis::from_bounds(vec![0, region.origin[d], region.end(d), shape[d]]))
            .collect(),
    )
}

/// A region being read from the inputs: the one piece it is read into.
struct Extraction<'x> {
    input: &'x InputArray,
    /// The input blocks' grid.
    inputs: &'x Partition,
    elem: u64,
    grid: &'x PieceGrid,
    witness: Option<&'x dyn InputWitness>,
}

/// What reading one input block's part made: its reads, to be counted in
/// the blocks' order, and the most bytes it held beside the region.
#[derive(Default)]
struct PartRead {
    reads: SeekLog,
    held: u64,
}

/// One input block's part of the region being read: the block, where the
/// part lies in the region and in the block's file, and how its rows lie.
struct Part<'x> {
    rank: u64,
    block: &'x InputBlock,
    region: Region,
    file_box: Region,
    layout: RowLayout,
}

impl Part<'_> {
    fn key(&self) -> FileKey {
        FileKey::Input(self.rank)
    }
}

impl Extraction<'_> {
    /// Input block `cell`'s part of the region.
    fn part(&self, cell: &[usize]) -> Result<Part<'_>> {
        let rank = self.inputs.linear(cell);
        let block_box = self.inputs.block(cell);
        let file_box = self.input.files.file_box(&block_box);
        let region = block_box
            .intersect(&self.grid.container())
            .ok_or_else(|| Error::Internal("an input block outside the region".into()))?;
        let layout = RowLayout::new(&region, &file_box, self.elem, self.grid);
        Ok(Part {
            rank,
            block: &self.input.blocks[rank as usize],
            region,
            file_box,
            layout,
        })
    }

    /// Reads the part of input block `cell` inside the region into
    /// `buffers`, the region's one piece, on this thread: through libhdf5
    /// when the block is an HDF5 dataset it reads.
    fn read_part_here(&self, cell: &[usize], buffers: &mut [Vec<u8>]) -> Result<PartRead> {
        let part = self.part(cell)?;
        match part.block.storage {
            Storage::Hdf5Dataset { .. } => self.read_by_library(&part, buffers),
            _ => self.read_part(&part, buffers),
        }
    }

    /// Reads the part of input block `cell` (not one libhdf5 reads) inside
    /// the region into `target`.
    fn read_claimed(
        &self,
        cell: &[usize],
        target: &mut (impl PieceTarget + ?Sized),
    ) -> Result<PartRead> {
        self.read_part(&self.part(cell)?, target)
    }

    /// Reads `part` (not one libhdf5 reads) into `target`, as its block is
    /// stored.
    fn read_part(&self, part: &Part, target: &mut (impl PieceTarget + ?Sized)) -> Result<PartRead> {
        match &part.block.storage {
            Storage::Absent { fill } => self.fill_absent(part, fill, target),
            _ if self.input.files.is_encoded() => self.read_encoded(part, target),
            _ => self.read_span(part, target),
        }
    }

    /// An HDF5 dataset's part, read by libhdf5 straight into `buffers`.
    fn read_by_library(&self, part: &Part, buffers: &mut [Vec<u8>]) -> Result<PartRead> {
        let (handle, then) = InputHandle::open(self.input, part.rank, None, self.witness)?;
        let InputHandle::Hdf5(reader) = &handle else {
            return Err(unchecked(&part.block.path));
        };
        let mut read = PartRead::default();
        count_as_contiguous(&part.layout, |offset, len| {
            read.reads.read(part.key(), offset, len)
        })?;
        let place = InFile::of(&part.region, &part.file_box);
        read_hdf5_pieces(reader, &place, &part.region, self.grid, buffers)?;
        unchanged(part.block, &then, &handle.identity_now(part.block)?)?;
        Ok(read)
    }

    /// An absent chunk's part: nothing to read, no I/O made or counted, no
    /// chunk decoded; the fill value goes straight into the rows. (The
    /// executor counts an absent chunk's segments as if read, to keep to
    /// its plan; an extraction has no plan to keep to.)
    fn fill_absent(
        &self,
        part: &Part,
        fill: &[u8],
        target: &mut (impl PieceTarget + ?Sized),
    ) -> Result<PartRead> {
        if let Some(witness) = self.witness {
            witness.reading(part.rank, part.block, None)?;
        }
        let layout = &part.layout;
        layout.for_each_segment(|segment| layout.fill_segment(segment, target, fill))?;
        Ok(PartRead::default())
    }

    /// An encoded block's part: the block read whole and decoded, and the
    /// part copied out of it. The witness is told of the file by the open.
    fn read_encoded(
        &self,
        part: &Part,
        target: &mut (impl PieceTarget + ?Sized),
    ) -> Result<PartRead> {
        let opened = InputHandle::open(self.input, part.rank, None, self.witness)?;
        let mut read = PartRead::default();
        let mut encoded_len = 0;
        let shape = &part.file_box.shape;
        let decoded = decoded_block(Some(&opened.0), part.block, shape, |offset, len| {
            encoded_len = len;
            read.reads.read(part.key(), offset, len)
        })?;
        // The encoding is held while it is decoded.
        read.held = decoded.len() as u64 + encoded_len;
        let (handle, then) = &opened;
        unchanged(part.block, then, &handle.identity_now(part.block)?)?;
        let layout = &part.layout;
        layout
            .for_each_segment(|segment| layout.copy_segment_from(&decoded, 0, segment, target))?;
        Ok(read)
    }

    /// A contiguous block's part: one read of the span from the part's
    /// first byte to its last, then rows copied out. An out-of-order
    /// extraction pays in seeks, and a row-by-row read of a partial input
    /// block would make one per row.
    fn read_span(&self, part: &Part, target: &mut (impl PieceTarget + ?Sized)) -> Result<PartRead> {
        let block = part.block;
        let (first, end) = span_of(&part.layout)?;
        let opened = open_with_span_ahead(block, first, end)?;
        let (handle, then) = InputHandle::open(self.input, part.rank, opened, self.witness)?;
        let InputHandle::Contiguous { file, data_offset } = &handle else {
            return Err(unchecked(&block.path));
        };
        let mut span = vec![0u8; (end - first) as usize];
        let at = data_offset + first;
        seekio::read_exact_at(file, &block.path, &mut [IoSliceMut::new(&mut span)], at)?;
        let mut read = PartRead {
            held: end - first,
            ..PartRead::default()
        };
        read.reads.read(part.key(), at, end - first);
        let layout = &part.layout;
        layout
            .for_each_segment(|segment| layout.copy_segment_from(&span, first, segment, target))?;
        unchanged(block, &then, &handle.identity_now(block)?)?;
        Ok(read)
    }
}

/// The span of `layout`'s file data from its first byte to its last, as
/// `(first, end)` offsets.
fn span_of(layout: &RowLayout) -> Result<(u64, u64)> {
    let (mut first, mut end) = (u64::MAX, 0);
    layout.for_each_segment(|segment| {
        first = first.min(segment.offset);
        end = end.max(segment.offset + segment.len);
        Ok(())
    })?;
    Ok((first, end))
}

/// The file of `block`, opened with its header and the span `[first, end)`
/// of its data asked for at once when the header is still to be checked;
/// None when there is nothing to check (the read opens it then). Asked for
/// apart, the check's small read would fetch the header alone (the kernel
/// reads ahead 16 KiB after a first read of one page) and the span would
/// wait for a second trip to the disk.
fn open_with_span_ahead(
    block: &InputBlock,
    first: u64,
    end: u64,
) -> Result<Option<(File, Metadata)>> {
    let (Some(check), Storage::Contiguous { data_offset }) = (&block.check, &block.storage) else {
        return Ok(None);
    };
    let (file, meta) = open_regular_with_metadata(&block.path)?;
    read_ahead_input(
        &file,
        Some(check.as_ref()),
        data_offset + first,
        end - first,
    );
    Ok(Some((file, meta)))
}
