//! One output block's bytes on demand, read straight from the inputs ahead
//! of the plan: the view serves a block a reader asks for before the plan
//! reaches it.

use std::fs::{File, Metadata};
use std::io::IoSliceMut;

use super::inputs::{
    count_as_contiguous, decoded_block, read_ahead_input, read_hdf5_pieces, unchanged, unchecked,
    InputHandle, InputWitness,
};
use super::pieces::{InFile, PieceGrid, RowLayout};
use super::seekio::{self, FileKey, SeekCounter};
use crate::array::geometry::{Axis, IndexBox, Partition, Region};
use crate::error::Result;
use crate::format::Storage;
use crate::input::{InputArray, InputBlock};
use crate::sys::files::open_regular_with_metadata;

/// Reads `region` of the whole array into `dest`, a C-order buffer of the
/// region's shape, straight from the input blocks it overlaps: one read
/// per input block (the span of its part), counted in `counter`, each
/// input told to `witness` first; an absent chunk is filled in memory,
/// nothing read or counted. For extracting one output block ahead
/// of the plan. An input whose file changes while its part is read
/// ([`Error::InputChanged`](crate::error::Error::InputChanged)) fails the
/// extraction: the region would mix two versions of it.
///
/// Returns the most bytes it held beside `dest` at once (one part's span,
/// or one decoded block and its encoding), never above
/// [`region_read_bytes`].
pub fn read_region(
    input: &InputArray,
    region: &Region,
    dest: &mut Vec<u8>,
    counter: &mut SeekCounter,
    witness: Option<&dyn InputWitness>,
) -> Result<u64> {
    let grid_of_inputs = input.grid();
    let mut extraction = Extraction {
        input,
        elem: input.dtype.size as u64,
        grid: PieceGrid::new(&cut_at(region, &input.shape), region),
        counter,
        witness,
        held: 0,
    };
    let buffers = std::slice::from_mut(dest);
    for input_index in IndexBox::new(grid_of_inputs.overlapping(region)) {
        let block_box = grid_of_inputs.block(&input_index);
        let file_box = input.files.file_box(&block_box);
        let Some(part) = block_box.intersect(region) else {
            continue;
        };
        let rank = grid_of_inputs.linear(&input_index);
        extraction.read_part(rank, &part, &file_box, buffers)?;
    }
    Ok(extraction.held)
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
    elem: u64,
    grid: PieceGrid,
    counter: &'x mut SeekCounter,
    witness: Option<&'x dyn InputWitness>,
    /// The most bytes held beside the region's piece so far.
    held: u64,
}

impl Extraction<'_> {
    /// Reads `part` of input block `rank` (whose file holds `file_box`)
    /// into the region's piece `buffers`.
    fn read_part(
        &mut self,
        rank: u64,
        part: &Region,
        file_box: &Region,
        buffers: &mut [Vec<u8>],
    ) -> Result<()> {
        let block = &self.input.blocks[rank as usize];
        let key = FileKey::Input(rank);
        let layout = RowLayout::new(part, file_box, self.elem, &self.grid);
        if let Storage::Absent { fill } = &block.storage {
            // Nothing to read: no I/O is made or counted, and no chunk is
            // decoded; the fill value goes straight into the rows. (The
            // executor counts an absent chunk's segments as if read, to
            // keep to its plan; an extraction has no plan to keep to.)
            if let Some(witness) = self.witness {
                witness.reading(rank, block, None)?;
            }
            return layout.for_each_segment(|segment| layout.fill_segment(segment, buffers, fill));
        }
        if self.input.files.is_encoded() {
            return self.read_encoded_part(rank, &layout, file_box, buffers);
        }
        // One read of the span from the part's first byte to its last, then
        // rows copied out: an out-of-order extraction pays in seeks, and a
        // row-by-row read of a partial input block would make one per row.
        let (first, end) = span_of(&layout)?;
        let opened = open_with_span_ahead(block, first, end)?;
        let (handle, then) = InputHandle::open(self.input, rank, opened, self.witness)?;
        match &handle {
            InputHandle::Contiguous { file, data_offset } => {
                self.held = self.held.max(end - first);
                let mut span = vec![0u8; (end - first) as usize];
                let at = data_offset + first;
                seekio::read_exact_at(file, &block.path, &mut [IoSliceMut::new(&mut span)], at)?;
                self.counter.read(key, at, end - first);
                layout.for_each_segment(|segment| {
                    layout.copy_segment_from(&span, first, segment, buffers)
                })?;
            }
            InputHandle::Hdf5(reader) => {
                let counter = &mut *self.counter;
                count_as_contiguous(&layout, |offset, len| counter.read(key, offset, len))?;
                read_hdf5_pieces(
                    reader,
                    &InFile::of(part, file_box),
                    part,
                    &self.grid,
                    buffers,
                )?;
            }
            InputHandle::Opened(..) | InputHandle::Encoded(_) => {
                return Err(unchecked(&block.path))
            }
        }
        unchanged(block, &then, &handle.identity_now(block)?)
    }

    /// Reads `layout`'s part of encoded input block `rank` (whose decoded
    /// block is `file_box`) into `buffers`: the block is read whole and
    /// decoded, and the part copied out of it.
    fn read_encoded_part(
        &mut self,
        rank: u64,
        layout: &RowLayout,
        file_box: &Region,
        buffers: &mut [Vec<u8>],
    ) -> Result<()> {
        let block = &self.input.blocks[rank as usize];
        // The witness is told of the file by the open (absent chunks are
        // filled before this).
        let opened = Some(InputHandle::open(self.input, rank, None, self.witness)?);
        let handle = opened.as_ref().map(|(handle, _)| handle);
        let counter = &mut *self.counter;
        let key = FileKey::Input(rank);
        let mut encoded_len = 0;
        let decoded = decoded_block(handle, block, &file_box.shape, |offset, len| {
            encoded_len = len;
            counter.read(key, offset, len)
        })?;
        // The encoding is held while it is decoded.
        self.held = self.held.max(decoded.len() as u64 + encoded_len);
        if let Some((handle, then)) = &opened {
            unchanged(block, then, &handle.identity_now(block)?)?;
        }
        layout.for_each_segment(|segment| layout.copy_segment_from(&decoded, 0, segment, buffers))
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
