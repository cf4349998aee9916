//! What a format is and does, as one table row per format
//! ([`FormatTraits`]): its names, how its blocks are named, laid out, read
//! and written, and what it records beyond its voxels. Each format's file
//! holds its row; `format/mod.rs` registers the rows
//! ([`BlockFormat::traits`](super::block::BlockFormat)), and every stage
//! after `format` asks these questions of the row instead of matching on
//! formats.

use std::path::Path;

use super::block::{BlockFormat, BlockInfo, BlockTemplate};
use super::encoding::{Compression, Encoding};
use crate::array::axes::AxisOrder;
use crate::array::dtype::DType;
use crate::array::space::Space;
use crate::error::Result;

/// Learns a block file's shape, dtype and storage from its header; the
/// second argument is the dataset (formats without datasets ignore it).
pub type ProbeFn = fn(&Path, &str) -> Result<BlockInfo>;

/// Builds the template of a block of `shape` and `dtype` holding
/// `data_len` bytes of data: `(shape, dtype, dataset, data_len, alignment,
/// space)`, as [`super::template_in_space`] takes them.
pub type TemplateFn = fn(&[u64], DType, &str, u64, u64, &Space) -> Result<BlockTemplate>;

/// What a probed block file's header says of its place in the world.
pub type SpaceFn = fn(&Path, &BlockInfo) -> Result<Space>;

/// A template's bytes as the block whose first voxel is at `origin` needs
/// them: `(template, shape, dtype, space, origin)`.
pub type PlaceFn = fn(&BlockTemplate, &[u64], DType, &Space, &[u64]) -> BlockTemplate;

/// The files describing a whole array of `shape` in blocks of
/// `block_shape`, as `(name, bytes)`.
pub type MetadataFn = fn(&[u64], &[u64], DType, &Encoding) -> Vec<(&'static str, Vec<u8>)>;

/// The format blocks of a shape (internal C order) are written in, where
/// the shape outgrows the one asked for.
pub type WiderFn = fn(&[u64]) -> Option<BlockFormat>;

/// How a format names its block files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockNames {
    /// `{i}_{j}_{k}.{extension}`, by grid index.
    Indices,
    /// Zarr v2's chunk keys, `i.j.k`.
    ZarrV2,
    /// Zarr v3's default chunk keys, `c/i/j/k`.
    ZarrV3,
    /// By the voxels a block holds, `x0-x1_y0-y1_z0-z1` (Neuroglancer precomputed).
    VoxelRanges,
}

/// Which dataset of a file holds the array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dataset {
    /// The file holds one array, not datasets.
    None,
    /// The one `--dataset` names (HDF5).
    Named,
    /// Always this one, whatever `--dataset` says (MINC2's image).
    Fixed(&'static str),
}

/// How a format lays out a pyramid of levels and says what they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyramidKind {
    /// Level 0 in OUT, level k in OUT/k, and no file describing them.
    Plain,
    /// An OME-Zarr multiscale group: with more than one level, each level
    /// an array in its own directory `k` and the group's files in OUT.
    OmeZarr { zarr3: bool },
    /// Neuroglancer precomputed: always a pyramid, level 0 one of its
    /// scales, each scale in its own directory and the `info` in OUT.
    Precomputed,
}

/// Everything stages after `format` ask of a format: one row of the table.
#[derive(Clone, Copy, Debug)]
pub struct FormatTraits {
    /// The format's name as people write it, for messages.
    pub name: &'static str,
    /// The extension written on output files, without the dot (a Zarr
    /// array is a directory: its extension only tells staging copies of
    /// its chunks apart).
    pub extension: &'static str,
    /// The file extensions (without the dot, any case) that promise this
    /// format in an input.
    pub input_extensions: &'static [&'static str],
    /// The names `--format` also takes for it, beyond its input extensions.
    pub aliases: &'static [&'static str],
    /// The order people use for arrays of this format (see
    /// [`crate::array::axes`]).
    pub axis_order: AxisOrder,
    /// Whether edge blocks are stored padded to the full block shape.
    pub pads_edge_blocks: bool,
    /// How block files are named.
    pub names: BlockNames,
    /// How a block file is probed, or why it cannot be.
    pub probe: std::result::Result<ProbeFn, &'static str>,
    /// Whether an input file is the whole array, read page by page rather
    /// than probed as one block of a grid (TIFF).
    pub whole_file: bool,
    /// How an output block's template is built, or why the format is not
    /// written.
    pub template: std::result::Result<TemplateFn, &'static str>,
    /// Where headers record the array's place in the world, how to read it.
    pub space: Option<SpaceFn>,
    /// Where each block's header records where the block lies (its
    /// origin), how to write that into a template.
    pub place: Option<PlaceFn>,
    /// The files beside the blocks that describe the whole array (Zarr's
    /// `.zarray`, `zarr.json`); `None` where every file describes itself.
    pub array_metadata: Option<MetadataFn>,
    /// Whether blocks are data only with no description of the format's
    /// own, so that rechunkfs's metadata file describes them (data at offset 0).
    pub data_only: bool,
    /// Which dataset of a file holds the array.
    pub dataset: Dataset,
    /// Whether the headers of blocks of one shape and dtype are the same
    /// bytes wherever the block lies, so one can be checked against another.
    pub comparable_headers: bool,
    /// Whether probing costs enough (a library call under a global lock)
    /// that files with byte-identical headers are probed once.
    pub cache_probes: bool,
    /// Whether an input's stored values are scaled to physical ones by what
    /// each header says (MINC2's image-min/image-max), so `--values` chooses.
    pub stored_scaling: bool,
    /// Whether the format records one scaling of the values for the whole
    /// image (NIfTI's `scl_slope`/`scl_inter`), so stored values keep it.
    pub global_scaling: bool,
    /// Whether an input's leading axis (of four) is time, not space.
    pub leading_axis_is_time: bool,
    /// The format blocks of a shape (internal C order) need instead, where
    /// the shape outgrows this one (NIfTI-1's 16-bit sides).
    pub wider: Option<WiderFn>,
    /// How a pyramid of levels is laid out and described.
    pub pyramid: PyramidKind,
    /// The compressors blocks can be written with.
    pub compression: Compression,
    /// Whether blocks can be shards of smaller chunks (`--shard`).
    pub shards: bool,
}

impl FormatTraits {
    /// A format's row with every question answered "no": each format's
    /// row says what differs from it.
    pub const NONE: FormatTraits = FormatTraits {
        name: "",
        extension: "",
        input_extensions: &[],
        aliases: &[],
        axis_order: AxisOrder::C,
        pads_edge_blocks: false,
        names: BlockNames::Indices,
        probe: Err(""),
        whole_file: false,
        template: Err(""),
        space: None,
        place: None,
        array_metadata: None,
        data_only: false,
        dataset: Dataset::None,
        comparable_headers: false,
        cache_probes: false,
        stored_scaling: false,
        global_scaling: false,
        leading_axis_is_time: false,
        wider: None,
        pyramid: PyramidKind::Plain,
        compression: Compression::None,
        shards: false,
    };

    /// Whether rechunkfs writes this format.
    pub fn writes(&self) -> bool {
        self.template.is_ok()
    }
}

/// The template of a block that is data only, described by a metadata file
/// beside it (raw blocks, Zarr and precomputed chunks).
pub fn data_only_template(
    _shape: &[u64],
    _dtype: DType,
    _dataset: &str,
    data_len: u64,
    _alignment: u64,
    _space: &Space,
) -> Result<BlockTemplate> {
    Ok(BlockTemplate {
        prefix: Vec::new(),
        data_offset: 0,
        data_len,
        suffix: Vec::new(),
    })
}
