//! The files an output array is made of: where each output block's file
//! goes (a flat name like `2_0_1.h5` or `2.0.1`, or a nested path like
//! `c/2/0/1`), the directories nested paths need, and the shape of each
//! file's array (edge chunks padded for Zarr).
//!
//! One description serves `rechunk` (which creates these paths) and the
//! view (which serves them), so block files, Zarr v2 chunks and Zarr v3
//! nested chunks are one mechanism. Everything is computed from the grid:
//! nothing here holds a per-file table, so a grid of millions of blocks
//! costs nothing until a name is asked for. Pure naming; no I/O.

use crate::array::axes::AxisOrder;
use crate::array::geometry::{FileShape, Partition};
use crate::array::names::{parse_component, ChunkKey};
use crate::format::{precomputed, BlockFormat, BlockNames};

/// A directory of one level's tree (its root being the level's directory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LocalDir {
    Root,
    /// A nested directory with the first `depth` indices fixed, `rank`
    /// being their C-order rank among the first `depth` grid dimensions
    /// (for Zarr v3, depth 0 is `c/`, depth 1 is `c/i/`, ...).
    Nested {
        depth: usize,
        rank: u64,
    },
}

/// A node one level's tree holds below its root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LocalNode {
    Dir(LocalDir),
    /// The file of the output block of this C-order rank.
    Block(u64),
}

/// How a block's file name is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Naming {
    /// From its grid index, by the [`ChunkKey`].
    GridIndex,
    /// From the voxels it holds, `x0-x1_y0-y1_z0-z1` (Neuroglancer precomputed).
    VoxelRanges,
}

/// The output blocks of one grid (a level) as a tree of files.
#[derive(Clone, Debug)]
struct LevelTree {
    key: ChunkKey,
    naming: Naming,
    grid: Partition,
    files: FileShape,
    dims: Vec<usize>,
}

impl LevelTree {
    fn new(key: ChunkKey, grid: Partition, files: FileShape) -> LevelTree {
        let dims = grid.grid_shape();
        LevelTree {
            key,
            naming: Naming::GridIndex,
            grid,
            files,
            dims,
        }
    }

    /// The files `format` writes for the output blocks `grid`, block files
    /// named in `order` (the user's).
    fn for_output(format: BlockFormat, grid: Partition, order: AxisOrder) -> LevelTree {
        let files = output_file_shape(format, &grid);
        let key = format.chunk_key();
        let key = if format.pads_edge_blocks() {
            key
        } else {
            key.in_order(order)
        };
        let mut tree = LevelTree::new(key, grid, files);
        if format.traits().names == BlockNames::VoxelRanges {
            tree.naming = Naming::VoxelRanges;
        }
        tree
    }

    fn key(&self) -> &ChunkKey {
        &self.key
    }

    fn grid(&self) -> &Partition {
        &self.grid
    }

    fn files(&self) -> &FileShape {
        &self.files
    }

    fn block_count(&self) -> u64 {
        self.grid.count()
    }

    /// The shape of every block but the edge ones (a Zarr array's chunk shape).
    fn block_shape(&self) -> Vec<u64> {
        (0..self.grid.ndim())
            .map(|d| self.grid.axis(d).extent(0))
            .collect()
    }

    /// Path of block `rank` relative to the tree's root.
    fn path(&self, rank: u64) -> String {
        let index = self.grid.unravel(rank);
        match self.naming {
            Naming::GridIndex => self.key.path(&index),
            Naming::VoxelRanges => precomputed::chunk_name(&self.grid.block(&index)),
        }
    }

    /// The block a precomputed chunk name stands for, if it names one.
    fn parse_voxel_ranges(&self, name: &str) -> Option<Vec<usize>> {
        let ranges = precomputed::parse_chunk_name(name)?;
        let ndim = self.grid.ndim();
        let mut index = vec![0; ndim];
        for (i, &(start, end)) in ranges.iter().enumerate() {
            if i >= ndim {
                // An axis the array lacks: precomputed gives it length 1.
                if (start, end) != (0, 1) {
                    return None;
                }
                continue;
            }
            let d = ndim - 1 - i;
            let axis = self.grid.axis(d);
            if start >= axis.len() || !axis.is_boundary(start) {
                return None;
            }
            index[d] = axis.locate(start);
            if axis.end(index[d]) != end {
                return None;
            }
        }
        // A channel axis (the fourth) is whole in every chunk.
        Some(index)
    }

    /// Shape of the array block `rank`'s file holds.
    fn file_shape(&self, rank: u64) -> Vec<u64> {
        self.files
            .file_box(&self.grid.block(&self.grid.unravel(rank)))
            .shape
    }

    /// The nested directory the root stands for, if any (nested keys
    /// without a prefix put the first index's directories in the root).
    fn root_depth(&self) -> Option<usize> {
        (self.key.is_nested() && self.key.prefix.is_none()).then_some(0)
    }

    /// `(depth, rank)` of a directory that holds indices, if it does.
    fn level(&self, dir: LocalDir) -> Option<(usize, u64)> {
        match dir {
            LocalDir::Root => self.root_depth().map(|depth| (depth, 0)),
            LocalDir::Nested { depth, rank } => Some((depth, rank)),
        }
    }

    /// Depths of the nested directories below the root.
    fn nested_depths(&self) -> std::ops::Range<usize> {
        if !self.key.is_nested() {
            return 0..0;
        }
        let first = if self.key.prefix.is_some() { 0 } else { 1 };
        // The deepest directories hold files of the last index.
        first..self.dims.len()
    }

    fn dirs_at(&self, depth: usize) -> u64 {
        self.dims[..depth].iter().map(|&n| n as u64).product()
    }

    /// Number of nested directories (not counting the root).
    fn dir_count(&self) -> u64 {
        self.nested_depths().map(|d| self.dirs_at(d)).sum()
    }

    /// A dense numbering of the nested directories, `0..dir_count()`.
    fn dir_ordinal(&self, dir: LocalDir) -> Option<u64> {
        let LocalDir::Nested { depth, rank } = dir else {
            return None;
        };
        let depths = self.nested_depths();
        if !depths.contains(&depth) || rank >= self.dirs_at(depth) {
            return None;
        }
        Some((depths.start..depth).map(|d| self.dirs_at(d)).sum::<u64>() + rank)
    }

    fn dir_of_ordinal(&self, mut ordinal: u64) -> Option<LocalDir> {
        for depth in self.nested_depths() {
            let count = self.dirs_at(depth);
            if ordinal < count {
                return Some(LocalDir::Nested {
                    depth,
                    rank: ordinal,
                });
            }
            ordinal -= count;
        }
        None
    }

    /// The directory holding `dir`.
    fn parent(&self, dir: LocalDir) -> LocalDir {
        match dir {
            LocalDir::Root => LocalDir::Root,
            LocalDir::Nested { depth, rank } => {
                let parent_depth = depth.checked_sub(1);
                match parent_depth {
                    Some(d) if self.nested_depths().contains(&d) => LocalDir::Nested {
                        depth: d,
                        rank: rank / self.dims[d] as u64,
                    },
                    _ => LocalDir::Root,
                }
            }
        }
    }

    /// Number of entries of `dir` that belong to the tree.
    fn child_count(&self, dir: LocalDir) -> u64 {
        match self.level(dir) {
            Some((depth, _)) => self.dims[depth] as u64,
            None if self.key.is_nested() => 1, // the prefix directory
            None => self.block_count(),
        }
    }

    /// Entry `i` of `dir` (`i < child_count(dir)`): its name and node.
    fn child(&self, dir: LocalDir, i: u64) -> (String, LocalNode) {
        match self.level(dir) {
            Some((depth, rank)) => {
                let child_rank = rank * self.dims[depth] as u64 + i;
                if depth + 1 == self.dims.len() {
                    (
                        format!("{i}{}", self.key.suffix),
                        LocalNode::Block(child_rank),
                    )
                } else {
                    (
                        i.to_string(),
                        LocalNode::Dir(LocalDir::Nested {
                            depth: depth + 1,
                            rank: child_rank,
                        }),
                    )
                }
            }
            None => match &self.key.prefix {
                Some(prefix) if self.key.is_nested() => (
                    prefix.clone(),
                    LocalNode::Dir(LocalDir::Nested { depth: 0, rank: 0 }),
                ),
                _ => (self.path(i), LocalNode::Block(i)),
            },
        }
    }

    /// The entry `name` of `dir`, if the tree has it.
    fn lookup(&self, dir: LocalDir, name: &str) -> Option<LocalNode> {
        match self.level(dir) {
            Some((depth, _)) => {
                let leaf = depth + 1 == self.dims.len();
                let component = if leaf {
                    name.strip_suffix(self.key.suffix.as_str())?
                } else {
                    name
                };
                let i = parse_component(component, self.dims[depth])?;
                Some(self.child(dir, i as u64).1)
            }
            None if self.key.is_nested() => (self.key.prefix.as_deref() == Some(name))
                .then_some(LocalNode::Dir(LocalDir::Nested { depth: 0, rank: 0 })),
            None => {
                let index = match self.naming {
                    Naming::GridIndex => self.key.parse_flat(name, &self.dims)?,
                    Naming::VoxelRanges => self.parse_voxel_ranges(name)?,
                };
                Some(LocalNode::Block(self.grid.linear(&index)))
            }
        }
    }

    /// The path of a nested directory relative to the root (`c/2/0`).
    fn dir_path(&self, dir: LocalDir) -> String {
        let Some((depth, rank)) = self.level(dir) else {
            return String::new();
        };
        let mut indices = vec![0usize; depth];
        let mut rest = rank;
        for d in (0..depth).rev() {
            indices[d] = (rest % self.dims[d] as u64) as usize;
            rest /= self.dims[d] as u64;
        }
        let mut parts: Vec<String> = self.key.prefix.iter().cloned().collect();
        parts.extend(indices.iter().map(usize::to_string));
        parts.join("/")
    }
}

/// A directory of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Root,
    /// The directory of pyramid level `level` (`1/`), when it has one.
    Level(usize),
    /// A nested directory of level `level`'s chunks with the first `depth`
    /// indices fixed, `rank` being their C-order rank among the first
    /// `depth` grid dimensions (for Zarr v3, depth 0 is `c/`, depth 1 is
    /// `c/i/`, ...).
    Nested {
        level: usize,
        depth: usize,
        rank: u64,
    },
}

/// A node the tree holds below its root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Dir(Dir),
    /// The file of the output block of this rank: C order within its
    /// level, levels one after another.
    Block(u64),
}

/// The output blocks of one grid, or of every level of a pyramid, as a
/// tree of files: a level either in the root or in a directory of its own.
#[derive(Clone, Debug)]
pub struct FileTree {
    levels: Vec<LevelTree>,
    /// Per level: its directory's name (`None`: the root).
    dirs: Vec<Option<String>>,
    /// Per level: the rank of its first block.
    first_ranks: Vec<u64>,
}

impl FileTree {
    pub fn new(key: ChunkKey, grid: Partition, files: FileShape) -> FileTree {
        FileTree::of_levels(vec![LevelTree::new(key, grid, files)], vec![None])
    }

    /// The files `format` writes for the output blocks `grid`, block files
    /// named in `order` (the user's).
    pub fn for_output(format: BlockFormat, grid: Partition, order: AxisOrder) -> FileTree {
        FileTree::of_levels(vec![LevelTree::for_output(format, grid, order)], vec![None])
    }

    /// The files of a pyramid's levels `grids`, level `k` in directory
    /// `dirs[k]` (`None`: the root, for one level at most).
    pub fn pyramid(
        format: BlockFormat,
        grids: &[Partition],
        order: AxisOrder,
        dirs: Vec<Option<String>>,
    ) -> FileTree {
        let levels = grids
            .iter()
            .map(|grid| LevelTree::for_output(format, grid.clone(), order))
            .collect();
        FileTree::of_levels(levels, dirs)
    }

    fn of_levels(levels: Vec<LevelTree>, dirs: Vec<Option<String>>) -> FileTree {
        let mut first_ranks = Vec::with_capacity(levels.len());
        let mut next = 0;
        for level in &levels {
            first_ranks.push(next);
            next += level.block_count();
        }
        FileTree {
            levels,
            dirs,
            first_ranks,
        }
    }

    /// Level 0's chunk key.
    pub fn key(&self) -> &ChunkKey {
        self.levels[0].key()
    }

    /// Level 0's grid.
    pub fn grid(&self) -> &Partition {
        self.levels[0].grid()
    }

    /// How level 0's files are shaped around its blocks.
    pub fn files(&self) -> &FileShape {
        self.levels[0].files()
    }

    /// Blocks of every level.
    pub fn block_count(&self) -> u64 {
        self.first_ranks.last().copied().unwrap_or(0)
            + self.levels.last().map_or(0, |l| l.block_count())
    }

    /// Level 0's block shape (a Zarr array's chunk shape).
    pub fn block_shape(&self) -> Vec<u64> {
        self.levels[0].block_shape()
    }

    pub fn level_count(&self) -> usize {
        self.levels.len()
    }

    /// Level `k`'s grid.
    pub fn level_grid(&self, k: usize) -> &Partition {
        self.levels[k].grid()
    }

    /// The ranks of level `k`'s blocks.
    pub fn level_ranks(&self, k: usize) -> std::ops::Range<u64> {
        self.first_ranks[k]..self.first_ranks[k] + self.levels[k].block_count()
    }

    /// The level of block `rank`, and its rank within the level.
    pub fn level_of(&self, rank: u64) -> (usize, u64) {
        let k = self.first_ranks.partition_point(|&first| first <= rank) - 1;
        (k, rank - self.first_ranks[k])
    }

    /// Block `rank`'s box in its level's array.
    pub fn block_region(&self, rank: u64) -> crate::array::geometry::Region {
        let (k, local) = self.level_of(rank);
        let grid = self.levels[k].grid();
        grid.block(&grid.unravel(local))
    }

    /// Path of block `rank` relative to the tree's root.
    pub fn path(&self, rank: u64) -> String {
        let (k, local) = self.level_of(rank);
        let path = self.levels[k].path(local);
        match &self.dirs[k] {
            Some(dir) => format!("{dir}/{path}"),
            None => path,
        }
    }

    /// Shape of the array block `rank`'s file holds.
    pub fn file_shape(&self, rank: u64) -> Vec<u64> {
        let (k, local) = self.level_of(rank);
        self.levels[k].file_shape(local)
    }

    /// The level whose blocks are in the root, if one is.
    fn root_level(&self) -> Option<usize> {
        self.dirs.iter().position(Option::is_none)
    }

    /// Levels with a directory of their own, in order.
    fn level_dirs(&self) -> impl Iterator<Item = (usize, &String)> {
        self.dirs
            .iter()
            .enumerate()
            .filter_map(|(k, dir)| dir.as_ref().map(|name| (k, name)))
    }

    /// A directory as its level sees it.
    fn local(&self, dir: Dir) -> Option<(usize, LocalDir)> {
        match dir {
            Dir::Root => self.root_level().map(|k| (k, LocalDir::Root)),
            Dir::Level(k) => Some((k, LocalDir::Root)),
            Dir::Nested { level, depth, rank } => Some((level, LocalDir::Nested { depth, rank })),
        }
    }

    /// A level's directory or node as the whole tree names it.
    fn global_dir(&self, k: usize, dir: LocalDir) -> Dir {
        match dir {
            LocalDir::Root if self.dirs[k].is_some() => Dir::Level(k),
            LocalDir::Root => Dir::Root,
            LocalDir::Nested { depth, rank } => Dir::Nested {
                level: k,
                depth,
                rank,
            },
        }
    }

    fn global_node(&self, k: usize, node: LocalNode) -> Node {
        match node {
            LocalNode::Dir(dir) => Node::Dir(self.global_dir(k, dir)),
            LocalNode::Block(local) => Node::Block(self.first_ranks[k] + local),
        }
    }

    /// Number of directories below the root.
    pub fn dir_count(&self) -> u64 {
        self.level_dirs().count() as u64 + self.levels.iter().map(|l| l.dir_count()).sum::<u64>()
    }

    /// A dense numbering of the directories below the root, `0..dir_count()`.
    pub fn dir_ordinal(&self, dir: Dir) -> Option<u64> {
        let own = self.level_dirs().count() as u64;
        match dir {
            Dir::Root => None,
            Dir::Level(k) => self
                .level_dirs()
                .position(|(j, _)| j == k)
                .map(|i| i as u64),
            Dir::Nested { level, depth, rank } => {
                let before: u64 = self
                    .levels
                    .get(..level)?
                    .iter()
                    .map(|l| l.dir_count())
                    .sum();
                let local = self.levels[level].dir_ordinal(LocalDir::Nested { depth, rank })?;
                Some(own + before + local)
            }
        }
    }

    pub fn dir_of_ordinal(&self, ordinal: u64) -> Option<Dir> {
        let own = self.level_dirs().count() as u64;
        if ordinal < own {
            return self
                .level_dirs()
                .nth(ordinal as usize)
                .map(|(k, _)| Dir::Level(k));
        }
        let mut rest = ordinal - own;
        for (k, level) in self.levels.iter().enumerate() {
            if rest < level.dir_count() {
                return level
                    .dir_of_ordinal(rest)
                    .map(|dir| self.global_dir(k, dir));
            }
            rest -= level.dir_count();
        }
        None
    }

    /// The directory holding `dir`.
    pub fn parent(&self, dir: Dir) -> Dir {
        match self.local(dir) {
            Some((k, local @ LocalDir::Nested { .. })) => {
                self.global_dir(k, self.levels[k].parent(local))
            }
            _ => Dir::Root,
        }
    }

    /// Number of entries of `dir` that belong to the tree.
    pub fn child_count(&self, dir: Dir) -> u64 {
        let own = if dir == Dir::Root {
            self.level_dirs().count() as u64
        } else {
            0
        };
        own + self
            .local(dir)
            .map_or(0, |(k, local)| self.levels[k].child_count(local))
    }

    /// Entry `i` of `dir` (`i < child_count(dir)`): its name and node.
    pub fn child(&self, dir: Dir, i: u64) -> (String, Node) {
        let own = if dir == Dir::Root {
            self.level_dirs().count() as u64
        } else {
            0
        };
        if i < own {
            if let Some((k, name)) = self.level_dirs().nth(i as usize) {
                return (name.clone(), Node::Dir(Dir::Level(k)));
            }
        }
        match self.local(dir) {
            Some((k, local)) => {
                let (name, node) = self.levels[k].child(local, i - own);
                (name, self.global_node(k, node))
            }
            None => (String::new(), Node::Dir(Dir::Root)),
        }
    }

    /// The entry `name` of `dir`, if the tree has it.
    pub fn lookup(&self, dir: Dir, name: &str) -> Option<Node> {
        if dir == Dir::Root {
            if let Some((k, _)) = self.level_dirs().find(|(_, dir)| dir.as_str() == name) {
                return Some(Node::Dir(Dir::Level(k)));
            }
        }
        let (k, local) = self.local(dir)?;
        let node = self.levels[k].lookup(local, name)?;
        Some(self.global_node(k, node))
    }

    /// The path of a directory relative to the root (`1/c/2/0`).
    pub fn dir_path(&self, dir: Dir) -> String {
        let Some((k, local)) = self.local(dir) else {
            return String::new();
        };
        let inner = self.levels[k].dir_path(local);
        match (&self.dirs[k], inner.is_empty()) {
            (Some(name), true) => name.clone(),
            (Some(name), false) => format!("{name}/{inner}"),
            (None, _) => inner,
        }
    }
}

/// How `format`'s files are shaped around the blocks of `grid`: Zarr
/// stores every chunk at the full chunk shape.
pub fn output_file_shape(format: BlockFormat, grid: &Partition) -> FileShape {
    if format.pads_edge_blocks() {
        let chunk = (0..grid.ndim()).map(|d| grid.axis(d).extent(0)).collect();
        FileShape::Padded(chunk)
    } else {
        FileShape::Exact
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(key: ChunkKey, array: &[u64], block: &[u64]) -> FileTree {
        FileTree::new(
            key,
            Partition::regular(array, block),
            FileShape::Padded(block.to_vec()),
        )
    }

    #[test]
    fn keys_name_blocks_as_each_format_does() {
        assert_eq!(ChunkKey::block_files("h5").path(&[3, 0, 12]), "3_0_12.h5");
        assert_eq!(ChunkKey::zarr_v2().path(&[3, 0, 12]), "3.0.12");
        assert_eq!(ChunkKey::zarr_v3().path(&[3, 0, 12]), "c/3/0/12");
        assert_eq!(ChunkKey::zarr_v3().path(&[5]), "c/5");
        let grid = [4, 1, 13];
        for key in [ChunkKey::block_files("npy"), ChunkKey::zarr_v2()] {
            assert_eq!(
                key.parse_flat(&key.path(&[3, 0, 12]), &grid),
                Some(vec![3, 0, 12])
            );
        }
        let v2 = ChunkKey::zarr_v2();
        for bad in ["4.0.0", "3.0", "03.0.0", "3.0.0.0", "a.0.0", "3..0", ""] {
            assert_eq!(v2.parse_flat(bad, &grid), None, "{bad}");
        }
    }

    #[test]
    fn nested_tree_walks_down_to_every_chunk_and_back() {
        let t = tree(ChunkKey::zarr_v3(), &[10, 7, 5], &[4, 3, 5]);
        assert_eq!(t.block_count(), 3 * 3);
        assert_eq!(t.dir_count(), 1 + 3 + 9);
        assert_eq!(t.child_count(Dir::Root), 1);
        let c = t.lookup(Dir::Root, "c").unwrap();
        let Node::Dir(c) = c else { panic!() };
        assert_eq!(t.dir_path(c), "c");
        assert_eq!(t.child_count(c), 3);
        let Some(Node::Dir(c2)) = t.lookup(c, "2") else {
            panic!()
        };
        assert_eq!(t.dir_path(c2), "c/2");
        assert_eq!(t.parent(c2), c);
        assert_eq!(t.parent(c), Dir::Root);
        let Some(Node::Dir(c21)) = t.lookup(c2, "1") else {
            panic!()
        };
        assert_eq!(t.child_count(c21), 1);
        assert_eq!(t.lookup(c21, "0"), Some(Node::Block(2 * 3 + 1)));
        assert_eq!(t.child(c21, 0), ("0".to_string(), Node::Block(7)));
        assert_eq!(t.path(7), "c/2/1/0");
        assert_eq!(t.lookup(c21, "1"), None);
        assert_eq!(t.lookup(c, "3"), None);
        assert_eq!(t.lookup(c, "02"), None);
        assert_eq!(t.lookup(Dir::Root, "0"), None);
        for ordinal in 0..t.dir_count() {
            let dir = t.dir_of_ordinal(ordinal).unwrap();
            assert_eq!(t.dir_ordinal(dir), Some(ordinal));
        }
        assert_eq!(t.dir_of_ordinal(t.dir_count()), None);
        // The padded edge chunk's file is chunk-shaped.
        assert_eq!(t.file_shape(8), vec![4, 3, 5]);
    }

    #[test]
    fn a_pyramid_puts_each_level_in_its_directory() {
        let grids = [
            Partition::regular(&[10, 7], &[4, 4]),
            Partition::regular(&[5, 4], &[4, 4]),
            Partition::regular(&[3, 2], &[3, 2]),
        ];
        let dirs = vec![None, Some("1".to_string()), Some("2".to_string())];
        let t = FileTree::pyramid(BlockFormat::Npy, &grids, AxisOrder::C, dirs);
        assert_eq!(t.block_count(), 6 + 2 + 1);
        assert_eq!(t.level_ranks(1), 6..8);
        assert_eq!(t.level_of(7), (1, 1));
        assert_eq!(t.path(7), "1/1_0.npy");
        assert_eq!(t.path(8), "2/0_0.npy");
        assert_eq!(t.file_shape(7), vec![1, 4]);
        // The root holds the level directories, then level 0's blocks.
        assert_eq!(t.child_count(Dir::Root), 2 + 6);
        assert_eq!(
            t.child(Dir::Root, 0),
            ("1".to_string(), Node::Dir(Dir::Level(1)))
        );
        assert_eq!(
            t.child(Dir::Root, 2),
            ("0_0.npy".to_string(), Node::Block(0))
        );
        assert_eq!(t.lookup(Dir::Root, "2"), Some(Node::Dir(Dir::Level(2))));
        assert_eq!(t.lookup(Dir::Level(1), "1_0.npy"), Some(Node::Block(7)));
        assert_eq!(t.lookup(Dir::Level(1), "2_0.npy"), None);
        assert_eq!(t.parent(Dir::Level(2)), Dir::Root);
        assert_eq!(t.dir_count(), 2);
        for ordinal in 0..t.dir_count() {
            let dir = t.dir_of_ordinal(ordinal).unwrap();
            assert_eq!(t.dir_ordinal(dir), Some(ordinal));
        }
        // Zarr v3 levels: nested chunk directories under each level's.
        let dirs = (0..3).map(|k| Some(k.to_string())).collect();
        let z = FileTree::pyramid(BlockFormat::Zarr3, &grids, AxisOrder::C, dirs);
        assert_eq!(z.path(7), "1/c/1/0");
        let Some(Node::Dir(c)) = z.lookup(Dir::Level(1), "c") else {
            panic!()
        };
        assert_eq!(z.dir_path(c), "1/c");
        assert_eq!(z.parent(c), Dir::Level(1));
        assert_eq!(z.child_count(Dir::Root), 3);
        for ordinal in 0..z.dir_count() {
            let dir = z.dir_of_ordinal(ordinal).unwrap();
            assert_eq!(z.dir_ordinal(dir), Some(ordinal));
        }
    }

    #[test]
    fn precomputed_chunks_are_named_by_their_voxels() {
        let t = FileTree::for_output(
            BlockFormat::Precomputed,
            Partition::regular(&[10, 7, 5], &[4, 4, 4]),
            AxisOrder::C,
        );
        assert_eq!(t.path(0), "0-4_0-4_0-4");
        let last = t.block_count() - 1;
        assert_eq!(t.path(last), "4-5_4-7_8-10");
        assert_eq!(t.lookup(Dir::Root, "4-5_4-7_8-10"), Some(Node::Block(last)));
        assert_eq!(t.lookup(Dir::Root, "4-5_4-7_8-9"), None);
        assert_eq!(t.lookup(Dir::Root, "1-5_4-7_8-10"), None);
    }

    #[test]
    fn flat_tree_lists_blocks_in_the_root() {
        let t = FileTree::for_output(
            BlockFormat::Zarr,
            Partition::regular(&[10, 7], &[4, 3]),
            AxisOrder::C,
        );
        assert_eq!(t.dir_count(), 0);
        assert_eq!(t.child_count(Dir::Root), 9);
        assert_eq!(t.child(Dir::Root, 5), ("1.2".to_string(), Node::Block(5)));
        assert_eq!(t.lookup(Dir::Root, "2.2"), Some(Node::Block(8)));
        assert_eq!(t.file_shape(8), vec![4, 3]);
        let h5 = FileTree::for_output(
            BlockFormat::Hdf5,
            Partition::regular(&[10, 7], &[4, 3]),
            AxisOrder::C,
        );
        assert_eq!(h5.file_shape(8), vec![2, 1]);
        assert_eq!(h5.lookup(Dir::Root, "2_2.h5"), Some(Node::Block(8)));
    }
}
