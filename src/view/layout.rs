//! What the view serves and under which numbers: the array's layout, the
//! header bytes of each distinct block file shape, the static files beside
//! the blocks, and inode numbers computed from a block's rank, so that a
//! grid of millions of blocks costs no table.
//!
//! Inodes: the root, then the static files, then one per output block
//! (`FIRST_BLOCK_INO + rank`), then one per nested directory.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;

use crate::array::geometry::{IndexBox, Partition};
use crate::array::space::Space;
use crate::error::Result;
use crate::format::encode::{BlockEncode, ShardLayout};
use crate::format::ome::{Window, WorldAxis};
use crate::format::{self, BlockNames, BlockTemplate, PyramidKind};
use crate::output::directory::{metadata_json, OutputSpec};
use crate::output::filetree::{Dir, FileTree, Node};
use crate::output::pyramid::{
    level_array_metadata, level_dir, level_space, level_spec, pyramid_metadata,
};
use crate::plan::pyramid::Pyramid;
use crate::view::node::NodeKind;

pub const ROOT_INO: u64 = 1;
pub const METADATA_INO: u64 = 2;
pub const STATUS_INO: u64 = 3;
pub const WAIT_INO: u64 = 4;
/// Further static files (a Zarr array's metadata, a pyramid's per level)
/// take inodes from here...
const FIRST_EXTRA_STATIC_INO: u64 = 5;
/// ...up to here, where the blocks' begin.
const FIRST_BLOCK_INO: u64 = 256;
/// The metadata file: the whole array and its new grid, as JSON.
pub const METADATA_NAME: &str = crate::output::directory::METADATA_NAME;
/// Live progress, as JSON (what `rechunkfs status` reads).
pub const STATUS_NAME: &str = ".rechunkfs-status.json";
/// The status once materialising has ended: a read of it waits until then
/// (what `rechunkfs status --wait` reads, instead of polling). Not listed
/// in the root, so a tool copying the whole view does not wait on it.
pub const WAIT_NAME: &str = ".rechunkfs-wait.json";
/// Extended attribute of each block file: `done`, `pending` or `failed`.
pub const STATE_XATTR: &str = "user.rechunkfs.state";

/// The shape of what the view serves: the array and its blocks, written
/// as `output` describes, as `rechunk` would write them (encoded, they are
/// uncompressed shards, whose sizes are exact before their data exist).
/// It reads as its [`OutputSpec`] too (`layout.format`, `layout.dtype`).
#[derive(Clone, Debug)]
pub struct ViewLayout {
    pub source: std::path::PathBuf,
    pub array: Vec<u64>,
    pub input_block: Vec<u64>,
    pub output_block: Vec<u64>,
    pub output: OutputSpec,
}

impl Deref for ViewLayout {
    type Target = OutputSpec;

    fn deref(&self) -> &OutputSpec {
        &self.output
    }
}

/// The header bytes and layout of every distinct block file shape a view
/// serves (interior and edge files may differ).
///
/// Made before the staging area, so that a format that cannot hold the
/// blocks (NIfTI's limits, MINC2 scaling) is refused with nothing made.
pub struct BlockTemplates {
    /// By pyramid level (0 without one) and file shape.
    by_file_shape: HashMap<(usize, Vec<u64>), BlockTemplate>,
    /// How blocks are encoded whole (shards), if they are.
    encoder: Option<Arc<dyn BlockEncode>>,
}

impl BlockTemplates {
    pub fn for_view(layout: &ViewLayout, output: &Partition) -> Result<BlockTemplates> {
        BlockTemplates::for_levels(layout, std::slice::from_ref(output), None)
    }

    /// The templates of every level of a pyramid (`None`: of `grids[0]` alone).
    pub fn for_levels(
        layout: &ViewLayout,
        grids: &[Partition],
        pyramid: Option<&Pyramid>,
    ) -> Result<BlockTemplates> {
        if let Some(inner) = &layout.encoding.shard_chunks {
            // A sharded view has one level: `--levels` with `--shard` is refused earlier.
            return Self::for_shards(layout, &grids[0], inner);
        }
        let mut by_file_shape = HashMap::new();
        for (k, grid) in grids.iter().enumerate() {
            let spec = match pyramid {
                Some(pyramid) => level_spec(&layout.output, pyramid, k),
                None => layout.output.clone(),
            };
            for shape in distinct_file_shapes(layout, grid) {
                let template = spec.template_aligned(&shape, format::VIEW_DATA_ALIGNMENT)?;
                by_file_shape.insert((k, shape), template);
            }
        }
        Ok(BlockTemplates {
            by_file_shape,
            encoder: None,
        })
    }

    /// Every shard file is padded to the full shard: one template, whose
    /// trailer is the fixed index, and the encoder that lays shards out.
    fn for_shards(
        layout: &ViewLayout,
        output: &Partition,
        inner: &[u64],
    ) -> Result<BlockTemplates> {
        layout.encoding.check(layout.format)?;
        let shard: Vec<u64> = (0..output.ndim())
            .map(|d| output.axis(d).extent(0))
            .collect();
        let shards = ShardLayout::new(&shard, inner, layout.dtype)?;
        Ok(BlockTemplates {
            by_file_shape: HashMap::from([((0, shard), shards.template())]),
            encoder: Some(Arc::new(shards)),
        })
    }

    /// How blocks are encoded whole, if they are (shards).
    pub(super) fn encoder(&self) -> Option<Arc<dyn BlockEncode>> {
        self.encoder.clone()
    }

    /// The template of level `level`'s files of `file_shape`, one of the view's.
    pub(super) fn of_shape(&self, level: usize, file_shape: &[u64]) -> &BlockTemplate {
        // Every file shape was templated at construction.
        &self.by_file_shape[&(level, file_shape.to_vec())]
    }
}

/// Where level `k` lies in the world: the layout's space, scaled for a
/// downsampled level.
pub(super) fn level_space_of(layout: &ViewLayout, pyramid: Option<&Pyramid>, k: usize) -> Space {
    match pyramid {
        Some(pyramid) if k > 0 => level_space(&layout.space, &pyramid.scale(k)),
        _ => layout.space.clone(),
    }
}

/// Distinct file shapes: per dimension the interior and the edge extent,
/// so at most 2^N, found without walking a huge grid.
fn distinct_file_shapes(layout: &ViewLayout, output: &Partition) -> Vec<Vec<u64>> {
    let files = FileTree::for_output(layout.format, output.clone(), layout.axis_order);
    let extents: Vec<Vec<u64>> = (0..output.ndim())
        .map(|d| {
            let axis = output.axis(d);
            let mut list: Vec<u64> = [axis.extent(0), axis.extent(axis.count() - 1)]
                .iter()
                .map(|&e| files.files().file_extent(d, e))
                .collect();
            list.dedup();
            list
        })
        .collect();
    let counts: Vec<usize> = extents.iter().map(Vec::len).collect();
    IndexBox::grid(&counts)
        .map(|choice| {
            choice
                .iter()
                .enumerate()
                .map(|(d, &i)| extents[d][i])
                .collect()
        })
        .collect()
}

/// A file whose bytes are fixed at mount (metadata).
pub(super) struct StaticFile {
    /// The directory holding it.
    pub(super) dir: Dir,
    pub(super) ino: u64,
    pub(super) name: String,
    pub(super) bytes: Vec<u8>,
    /// The pyramid's metadata, which gains level 0's display window once
    /// it is known ([`windowed`]): its size and bytes change once.
    pub(super) windowed: bool,
}

/// The view's names: the block files' tree and the static files, and the
/// inode number of each.
pub(super) struct Namespace {
    files: FileTree,
    /// `rechunkfs.json` first, then the format's own metadata files.
    statics: Vec<StaticFile>,
}

impl Namespace {
    /// The names of a view of `files`; `pyramid` for a view of levels.
    pub(super) fn new(
        layout: &ViewLayout,
        files: FileTree,
        pyramid: Option<&ViewPyramid>,
    ) -> Namespace {
        let mut statics = vec![StaticFile {
            dir: Dir::Root,
            ino: METADATA_INO,
            name: METADATA_NAME.into(),
            bytes: view_metadata(layout, &files),
            windowed: false,
        }];
        let extra: Vec<(Dir, String, Vec<u8>, bool)> = match pyramid {
            Some(pyramid) => pyramid_files(layout, &files, pyramid),
            None => layout
                .format_metadata(&layout.array, &files.block_shape())
                .into_iter()
                .map(|(name, bytes)| (Dir::Root, name.to_string(), bytes, false))
                .collect(),
        };
        for (i, (dir, name, bytes, windowed)) in extra.into_iter().enumerate() {
            statics.push(StaticFile {
                dir,
                ino: FIRST_EXTRA_STATIC_INO + i as u64,
                name,
                bytes,
                windowed,
            });
        }
        Namespace { files, statics }
    }

    pub(super) fn files(&self) -> &FileTree {
        &self.files
    }

    pub(super) fn statics(&self) -> &[StaticFile] {
        &self.statics
    }

    pub(super) fn block_rank(&self, ino: u64) -> Option<u64> {
        let rank = ino.checked_sub(FIRST_BLOCK_INO)?;
        (rank < self.files.block_count()).then_some(rank)
    }

    pub(super) fn static_file(&self, ino: u64) -> Option<&StaticFile> {
        self.statics.iter().find(|file| file.ino == ino)
    }

    pub(super) fn static_named(&self, dir: Dir, name: &str) -> Option<&StaticFile> {
        self.statics
            .iter()
            .find(|file| file.dir == dir && file.name == name)
    }

    /// The directory an inode is, if it is one.
    pub(super) fn dir_of(&self, ino: u64) -> Option<Dir> {
        if ino == ROOT_INO {
            return Some(Dir::Root);
        }
        let ordinal = ino.checked_sub(FIRST_BLOCK_INO + self.files.block_count())?;
        self.files.dir_of_ordinal(ordinal)
    }

    pub(super) fn node_ino(&self, node: Node) -> u64 {
        match node {
            Node::Block(rank) => FIRST_BLOCK_INO + rank,
            Node::Dir(Dir::Root) => ROOT_INO,
            Node::Dir(dir) => {
                FIRST_BLOCK_INO
                    + self.files.block_count()
                    + self.files.dir_ordinal(dir).unwrap_or(0)
            }
        }
    }

    pub(super) fn node_kind(node: Node) -> NodeKind {
        match node {
            Node::Block(_) => NodeKind::File,
            Node::Dir(_) => NodeKind::Directory,
        }
    }
}

/// A view's pyramid: its levels, and its axes as viewers see them.
#[derive(Clone, Debug)]
pub struct ViewPyramid {
    pub pyramid: Pyramid,
    pub axes: Vec<WorldAxis>,
    /// Per level (from 1; 0 unused): output rows per pass building a block.
    pub rows: Vec<u64>,
    /// The most bytes building one block holds.
    pub peak_bytes: u64,
}

/// The files describing a pyramid, by directory, each marked if it
/// gains level 0's window ([`windowed`]): each Zarr level's array
/// metadata, and the pyramid's own ([`pyramid_metadata`]).
fn pyramid_files(
    layout: &ViewLayout,
    files: &FileTree,
    view: &ViewPyramid,
) -> Vec<(Dir, String, Vec<u8>, bool)> {
    let mut out = Vec::new();
    let count = view.pyramid.levels.len();
    if matches!(layout.format.traits().pyramid, PyramidKind::OmeZarr { .. }) {
        for k in 0..count {
            let dir = match level_dir(layout.format, count, k) {
                None => Dir::Root,
                Some(name) => match files.lookup(Dir::Root, &name) {
                    Some(Node::Dir(dir)) => dir,
                    _ => continue,
                },
            };
            let grid = &view.pyramid.levels[k];
            let block: Vec<u64> = (0..grid.ndim()).map(|d| grid.axis(d).extent(0)).collect();
            for (name, bytes) in layout.format_metadata(&grid.array_shape(), &block) {
                let bytes = level_array_metadata(&layout.output, &view.pyramid, bytes, &view.axes);
                out.push((dir, name.to_string(), bytes, false));
            }
        }
    }
    for (name, bytes) in pyramid_metadata(&layout.output, &view.pyramid, &view.axes, None) {
        out.push((Dir::Root, name.to_string(), bytes, true));
    }
    out
}

/// The pyramid's metadata file `name` with level 0's display window.
pub(super) fn windowed(
    layout: &ViewLayout,
    view: &ViewPyramid,
    name: &str,
    window: Option<Window>,
) -> Vec<u8> {
    pyramid_metadata(&layout.output, &view.pyramid, &view.axes, window)
        .into_iter()
        .find(|(file, _)| *file == name)
        .map(|(_, bytes)| bytes)
        .unwrap_or_default()
}

/// The metadata file's bytes: the array and its new grid as
/// [`metadata_json`] describes them, with the view's own naming (Zarr
/// chunk keys, nested or not) and edges.
fn view_metadata(layout: &ViewLayout, files: &FileTree) -> Vec<u8> {
    let output = files.grid();
    let mut value = metadata_json(
        &layout.output,
        &layout.array,
        &layout.input_block,
        output,
        &layout.source,
    );
    let letters = ["{i}", "{j}", "{k}", "{l}", "{m}", "{n}", "{o}", "{p}"];
    let key = files.key();
    let mut pattern = letters[..output.ndim()].join(&key.separator.to_string());
    if let Some(prefix) = &key.prefix {
        pattern = format!("{prefix}{}{pattern}", key.separator);
    }
    value["file_name_pattern"] = if layout.format.traits().names == BlockNames::VoxelRanges {
        serde_json::json!("{key}/{x0}-{x1}_{y0}-{y1}_{z0}-{z1}")
    } else {
        serde_json::json!(format!("{pattern}{}", key.suffix))
    };
    value["edge_blocks"] = serde_json::json!(if files.files().is_padded() {
        "edge chunks are padded to the full block shape, as Zarr stores them"
    } else {
        "edge blocks are smaller"
    });
    let mut bytes = serde_json::to_vec_pretty(&value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}
