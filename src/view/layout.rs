//! What the view serves and under which numbers: the array's layout, the
//! header bytes of each distinct block file shape, the static files beside
//! the blocks, and inode numbers computed from a block's rank, so that a
//! grid of millions of blocks costs no table.
//!
//! Inodes: the root, then the static files, then one per output block
//! (`FIRST_BLOCK_INO + rank`), then one per nested directory.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::array::axes::AxisOrder;
use crate::array::dtype::DType;
use crate::array::geometry::{IndexBox, Partition};
use crate::array::space::Space;
use crate::error::Result;
use crate::format::encode::{BlockEncode, Encoding, ShardLayout};
use crate::format::{self, BlockFormat, BlockTemplate};
use crate::output::directory::metadata_json;
use crate::output::filetree::{Dir, FileTree, Node};
use crate::view::NodeKind;

pub const ROOT_INO: u64 = 1;
pub const METADATA_INO: u64 = 2;
pub const STATUS_INO: u64 = 3;
pub const WAIT_INO: u64 = 4;
/// Further static files (a Zarr array's metadata) take inodes from here.
const FIRST_EXTRA_STATIC_INO: u64 = 5;
const FIRST_BLOCK_INO: u64 = 16;
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

/// The shape of what the view serves.
#[derive(Clone, Debug, Serialize)]
pub struct ViewLayout {
    pub source: std::path::PathBuf,
    pub array: Vec<u64>,
    pub dtype: DType,
    pub input_block: Vec<u64>,
    pub output_block: Vec<u64>,
    pub format: BlockFormat,
    pub dataset: String,
    /// Where the whole array lies in the world (NIfTI headers record it).
    pub space: Space,
    /// The order of names and shapes people see (the input's; see [`crate::array::axes`]).
    pub axis_order: AxisOrder,
    /// Sharded (Zarr v3): each output block is a shard of uncompressed
    /// chunks of this shape (internal order).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard_chunks: Option<Vec<u64>>,
}

impl ViewLayout {
    /// How the view's blocks are encoded: sharded, or not at all.
    pub fn encoding(&self) -> Encoding {
        Encoding {
            compressor: None,
            shard_chunks: self.shard_chunks.clone(),
        }
    }
}

/// The header bytes and layout of every distinct block file shape a view
/// serves (interior and edge files may differ).
///
/// Made before the staging area, so that a format that cannot hold the
/// blocks (NIfTI's limits, MINC2 scaling) is refused with nothing made.
pub struct BlockTemplates {
    by_file_shape: HashMap<Vec<u64>, BlockTemplate>,
    /// How blocks are encoded whole (shards), if they are.
    encoder: Option<Arc<dyn BlockEncode>>,
}

impl BlockTemplates {
    pub fn for_view(layout: &ViewLayout, output: &Partition) -> Result<BlockTemplates> {
        if let Some(inner) = &layout.shard_chunks {
            return Self::for_shards(layout, output, inner);
        }
        let mut by_file_shape = HashMap::new();
        for shape in distinct_file_shapes(layout, output) {
            let template = format::template_in_space(
                layout.format,
                &shape,
                layout.dtype,
                &layout.dataset,
                format::VIEW_DATA_ALIGNMENT,
                &layout.space,
            )?;
            by_file_shape.insert(shape, template);
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
        layout.encoding().check(layout.format)?;
        let shard: Vec<u64> = (0..output.ndim())
            .map(|d| output.axis(d).extent(0))
            .collect();
        let shards = ShardLayout::new(&shard, inner, layout.dtype)?;
        Ok(BlockTemplates {
            by_file_shape: HashMap::from([(shard, shards.template())]),
            encoder: Some(Arc::new(shards)),
        })
    }

    /// How blocks are encoded whole, if they are (shards).
    pub(super) fn encoder(&self) -> Option<Arc<dyn BlockEncode>> {
        self.encoder.clone()
    }

    /// The template of files of `file_shape`, one of the view's.
    pub(super) fn of_shape(&self, file_shape: &[u64]) -> &BlockTemplate {
        // Every file shape was templated at construction.
        &self.by_file_shape[file_shape]
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
    pub(super) ino: u64,
    pub(super) name: String,
    pub(super) bytes: Vec<u8>,
}

/// The view's names: the block files' tree and the static files, and the
/// inode number of each.
pub(super) struct Namespace {
    files: FileTree,
    /// `rechunkfs.json` first, then the format's own metadata files.
    statics: Vec<StaticFile>,
}

impl Namespace {
    pub(super) fn new(layout: &ViewLayout, files: FileTree) -> Namespace {
        let mut statics = vec![StaticFile {
            ino: METADATA_INO,
            name: METADATA_NAME.into(),
            bytes: view_metadata(layout, &files),
        }];
        let format_files = format::array_metadata_files(
            layout.format,
            &layout.array,
            &files.block_shape(),
            layout.dtype,
            &layout.encoding(),
        );
        for (i, (name, bytes)) in format_files.into_iter().enumerate() {
            statics.push(StaticFile {
                ino: FIRST_EXTRA_STATIC_INO + i as u64,
                name: name.into(),
                bytes,
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

    pub(super) fn static_named(&self, name: &str) -> Option<&StaticFile> {
        self.statics.iter().find(|file| file.name == name)
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

/// The metadata file's bytes: the array and its new grid as
/// [`metadata_json`] describes them, with the view's own naming (Zarr
/// chunk keys, nested or not) and edges.
fn view_metadata(layout: &ViewLayout, files: &FileTree) -> Vec<u8> {
    let output = files.grid();
    let mut value = metadata_json(
        &layout.array,
        layout.dtype,
        &layout.input_block,
        output,
        layout.format,
        &layout.dataset,
        layout.axis_order,
        &layout.source,
    );
    let letters = ["{i}", "{j}", "{k}", "{l}", "{m}", "{n}", "{o}", "{p}"];
    let key = files.key();
    let mut pattern = letters[..output.ndim()].join(&key.separator.to_string());
    if let Some(prefix) = &key.prefix {
        pattern = format!("{prefix}{}{pattern}", key.separator);
    }
    value["file_name_pattern"] = serde_json::json!(format!("{pattern}{}", key.suffix));
    value["edge_blocks"] = serde_json::json!(if files.files().is_padded() {
        "edge chunks are padded to the full block shape, as Zarr stores them"
    } else {
        "edge blocks are smaller"
    });
    let mut bytes = serde_json::to_vec_pretty(&value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}
