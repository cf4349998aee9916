//! Putting a directory's block files together into one array. The grid is
//! never guessed: each step below refuses what it cannot make whole (a
//! missing or duplicated index, mixed formats or dtypes, a block whose
//! shape disagrees with its position), naming the file and the problem.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::array::InputArray;
use super::block::{HeaderChecks, InputBlock};
use super::discover::NamedBlock;
use super::probe::{self, Probed};
use crate::array::axes::AxisOrder;
use crate::array::dtype::DType;
use crate::array::geometry;
use crate::array::names::grid_name;
use crate::error::{Error, Result};
use crate::format::{BlockFormat, BlockInfo};

/// The array the block files `named` of `dir` make, with their headers
/// read as `checks` says.
pub(super) fn assemble_grid(
    dir: &Path,
    named: Vec<NamedBlock>,
    dataset: String,
    checks: HeaderChecks,
) -> Result<InputArray> {
    // Formats whose headers do not depend on the block's position (NIfTI's
    // and MINC2's place it in the world) can be checked against another's.
    let comparable = named
        .first()
        .is_some_and(|block| block.format.traits().comparable_headers);
    if checks == HeaderChecks::AtScan || !comparable {
        return assemble(dir, named, dataset, false);
    }
    match assemble(dir, named.clone(), dataset.clone(), true) {
        Ok(array) => Ok(array),
        // Found among the few blocks probed: a full scan names the odd
        // block out the way it always does.
        Err(error) => assemble(dir, named, dataset, false).and(Err(error)),
    }
}

/// Checks the names of `named`, probes their headers (with `defer`, only
/// those [`HeaderChecks::BeforeUse`] needs) and puts the array together.
fn assemble(
    dir: &Path,
    named: Vec<NamedBlock>,
    dataset: String,
    defer: bool,
) -> Result<InputArray> {
    let names = index_names(dir, &named)?;
    let grid = complete_grid(dir, &names)?;
    let order = names.format.axis_order();
    let entries: Vec<(Vec<usize>, PathBuf)> = names.by_index.into_iter().collect();
    let kinds: Vec<usize> = entries
        .iter()
        .map(|(index, _)| kind_of(index, &grid))
        .collect();
    let probed = probe::probe_representatives(&entries, &kinds, defer, names.format, &dataset)?;
    let found = collect_blocks(dir, &entries, &kinds, probed, names.ndim)?;
    let extents = Extents::most_common(&found.shapes, &grid);
    extents.check_shapes(&found.shapes, &grid, order)?;
    extents.check_edges_shorter(dir, order)?;
    let shape: Vec<u64> = (0..names.ndim)
        .map(|d| extents.interior[d] * (grid[d] as u64 - 1) + extents.last[d])
        .collect();
    Ok(InputArray {
        source: dir.to_path_buf(),
        format: names.format,
        dataset,
        dtype: found.dtype,
        shape,
        block_shape: extents.interior,
        files: super::discover::files_of(&found.blocks)?,
        blocks: found.blocks,
    })
}

/// The block files of a directory by grid index: one format, one rank,
/// no index twice.
struct Names {
    format: BlockFormat,
    ndim: usize,
    by_index: BTreeMap<Vec<usize>, PathBuf>,
}

/// Grid indices as the file names write them.
fn user_name(order: AxisOrder, index: &[usize]) -> String {
    grid_name(&order.to_user(index))
}

/// `named` by grid index, each checked against the first: the same format,
/// as many indices, and an index of its own.
fn index_names(dir: &Path, named: &[NamedBlock]) -> Result<Names> {
    let Some(first) = named.first() else {
        return Err(Error::bad_input(
            dir,
            "holds no block files; expected files named by grid index like 0_0_0.h5 or 0_0_0.npy",
        ));
    };
    let ndim = first.index.len();
    if ndim > geometry::MAX_DIMS {
        return Err(Error::bad_input(
            &first.path,
            format!(
                "names {ndim} dimensions; rechunkfs handles 1 to {}",
                geometry::MAX_DIMS
            ),
        ));
    }
    // Duplicates first: `0_0_0.h5` beside `0_0_0.npy` is one index named
    // twice, whatever else differs between the two.
    let mut by_index: BTreeMap<Vec<usize>, PathBuf> = BTreeMap::new();
    for block in named {
        if let Some(other) = by_index.insert(block.index.clone(), block.path.clone()) {
            return Err(Error::bad_input(
                &block.path,
                format!(
                    "duplicates block {}: {} claims the same grid index; keep one of them",
                    user_name(block.format.axis_order(), &block.index),
                    other.display()
                ),
            ));
        }
    }
    for block in named {
        check_like_first(block, first)?;
    }
    Ok(Names {
        format: first.format,
        ndim,
        by_index,
    })
}

/// Refuses `block` if its format or its number of indices differs from
/// `first`'s.
fn check_like_first(block: &NamedBlock, first: &NamedBlock) -> Result<()> {
    if block.format != first.format {
        return Err(Error::bad_input(
            &block.path,
            format!(
                "is {} but {} is {}: all blocks of one array must share a format",
                block.format.name(),
                first.path.display(),
                first.format.name()
            ),
        ));
    }
    let ndim = first.index.len();
    if block.index.len() != ndim {
        return Err(Error::bad_input(
            &block.path,
            format!(
                "names a {}-dimensional grid index but {} names a {ndim}-dimensional one",
                block.index.len(),
                first.path.display()
            ),
        ));
    }
    Ok(())
}

/// The grid shape the names span, once every index in it is named.
fn complete_grid(dir: &Path, names: &Names) -> Result<Vec<usize>> {
    let grid: Vec<usize> = (0..names.ndim)
        .map(|d| names.by_index.keys().map(|i| i[d]).max().unwrap_or(0) + 1)
        .collect();
    let order = names.format.axis_order();
    for index in geometry::IndexBox::grid(&grid) {
        if !names.by_index.contains_key(&index) {
            return Err(Error::bad_input(
                dir,
                format!(
                    "block {} is missing: the names present span a {} grid, which needs all {} blocks",
                    user_name(order, &index),
                    order.to_user(&grid).iter().map(|n| n.to_string()).collect::<Vec<_>>().join("×"),
                    grid.iter().product::<usize>()
                ),
            ));
        }
    }
    Ok(grid)
}

/// A block's kind: the dimensions along which it is the last in `grid`,
/// which decide its shape.
fn kind_of(index: &[usize], grid: &[usize]) -> usize {
    (0..index.len()).fold(0, |kind, d| {
        kind << 1 | usize::from(index[d] == grid[d] - 1)
    })
}

/// A probed block's shape, with its place.
struct BlockShape {
    index: Vec<usize>,
    path: PathBuf,
    shape: Vec<u64>,
}

/// The input blocks, and what the probed ones hold.
struct Found {
    blocks: Vec<InputBlock>,
    shapes: Vec<BlockShape>,
    dtype: DType,
}

/// The blocks of `entries` in C order, from their probes or their kind's
/// stand-in; each probed block must have `ndim` dimensions and the dtype
/// of the first.
fn collect_blocks(
    dir: &Path,
    entries: &[(Vec<usize>, PathBuf)],
    kinds: &[usize],
    probed: Probed,
    ndim: usize,
) -> Result<Found> {
    let mut blocks = Vec::with_capacity(entries.len());
    let mut shapes = Vec::with_capacity(entries.len());
    let mut dtype: Option<DType> = None;
    for (((index, path), kind), info) in entries.iter().zip(kinds).zip(probed.infos) {
        let Some(info) = info else {
            let Some((storage, check)) = probed.stand_ins.get(kind) else {
                return Err(Error::bad_input(
                    path,
                    "was neither probed nor like a probed block",
                ));
            };
            blocks.push(InputBlock {
                path: path.clone(),
                storage: storage.clone(),
                check: Some(check.clone()),
            });
            continue;
        };
        dtype = Some(check_probed(path, &info, ndim, dtype, &entries[0].1)?);
        shapes.push(BlockShape {
            index: index.clone(),
            path: path.clone(),
            shape: info.shape,
        });
        blocks.push(InputBlock {
            path: path.clone(),
            storage: info.storage,
            check: None,
        });
    }
    let dtype = dtype.ok_or_else(|| Error::bad_input(dir, "holds no block files"))?;
    Ok(Found {
        blocks,
        shapes,
        dtype,
    })
}

/// The dtype of the array so far (`dtype`, that of the first probed
/// block; `None` before it), once the probed block at `path` is checked
/// to have `ndim` dimensions and that dtype. `first_path` is the first
/// block in C order, which the message names.
fn check_probed(
    path: &Path,
    info: &BlockInfo,
    ndim: usize,
    dtype: Option<DType>,
    first_path: &Path,
) -> Result<DType> {
    if info.shape.len() != ndim {
        return Err(Error::bad_input(
            path,
            format!(
                "holds a {}-dimensional array but its name gives {ndim} grid indices",
                info.shape.len()
            ),
        ));
    }
    match dtype {
        Some(first) if first != info.dtype => Err(Error::bad_input(
            path,
            format!(
                "has dtype {} but {} has {}: all blocks must share one dtype",
                info.dtype,
                first_path.display(),
                first
            ),
        )),
        Some(first) => Ok(first),
        None => Ok(info.dtype),
    }
}

/// Along each dimension, blocks before the last share one extent and the
/// last ones share another, no longer.
struct Extents {
    interior: Vec<u64>,
    last: Vec<u64>,
}

impl Extents {
    /// The extents most blocks in each position have, so that the odd
    /// block out is the one named.
    fn most_common(shapes: &[BlockShape], grid: &[usize]) -> Extents {
        let ndim = grid.len();
        let mut interior = vec![0u64; ndim];
        let mut last = vec![0u64; ndim];
        for d in 0..ndim {
            let most_common = |is_last: bool| -> u64 {
                let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
                for block in shapes {
                    if (block.index[d] == grid[d] - 1) == is_last {
                        *counts.entry(block.shape[d]).or_default() += 1;
                    }
                }
                counts
                    .into_iter()
                    .max_by_key(|&(extent, n)| (n, extent))
                    .map_or(0, |(e, _)| e)
            };
            last[d] = most_common(true);
            interior[d] = if grid[d] > 1 {
                most_common(false)
            } else {
                last[d]
            };
        }
        Extents { interior, last }
    }

    /// Refuses the first block whose shape does not fit its position.
    fn check_shapes(&self, shapes: &[BlockShape], grid: &[usize], order: AxisOrder) -> Result<()> {
        let ndim = grid.len();
        for block in shapes {
            for (d, &blocks_along) in grid.iter().enumerate() {
                let is_last = block.index[d] == blocks_along - 1;
                let expected = if is_last {
                    self.last[d]
                } else {
                    self.interior[d]
                };
                if block.shape[d] != expected {
                    let example = shapes
                        .iter()
                        .find(|other| {
                            (other.index[d] == blocks_along - 1) == is_last
                                && other.shape[d] == expected
                        })
                        .map_or(String::new(), |other| {
                            format!(" (like {})", other.path.display())
                        });
                    return Err(Error::bad_input(
                        &block.path,
                        format!(
                            "has shape {} which does not fit its position {} in the grid: along \
                             dimension {} {} blocks are {expected} long{example}, this one is {}",
                            geometry::show_shape(&order.to_user(&block.shape)),
                            user_name(order, &block.index),
                            order.user_axis(d, ndim),
                            if is_last {
                                "the last"
                            } else {
                                "all but the last"
                            },
                            block.shape[d]
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Refuses last blocks longer than the others: only edge blocks may
    /// differ, and only by being shorter.
    fn check_edges_shorter(&self, dir: &Path, order: AxisOrder) -> Result<()> {
        let ndim = self.last.len();
        for d in 0..ndim {
            if self.last[d] > self.interior[d] {
                return Err(Error::bad_input(
                    dir,
                    format!(
                        "along dimension {} the last blocks are {} long, longer than the others \
                         ({}): only edge blocks may differ, and only by being shorter",
                        order.user_axis(d, ndim),
                        self.last[d],
                        self.interior[d]
                    ),
                ));
            }
        }
        Ok(())
    }
}
