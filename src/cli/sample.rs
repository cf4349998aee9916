//! `sample`, and the synthetic arrays it writes (tests write them too),
//! whose every voxel can be checked: the bytes of the element at C-order
//! linear index `n` of the whole array are the first bytes of
//! `splitmix64(n)`. Any misplaced, dropped or duplicated element shows,
//! whatever the dtype; readers in other languages recompute it in a line
//! (`tests/fixtures/verify.py` does).
//!
//! Shapes here are internal C order; files are named in the user-facing
//! order of their format (see [`crate::array::axes`]), so a NIfTI sample's names
//! and nibabel's shapes agree.

use std::path::Path;

use crate::array::dtype::DType;
use crate::array::geometry::{self, IndexBox, Partition, Region};
use crate::array::names::grid_name;
use crate::array::units::parse_shape;
use crate::error::{Error, Result};
use crate::format::{self, BlockFormat};

/// The splitmix64 finaliser of `n`: a bijection of 64-bit integers with good mixing.
pub fn splitmix64(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The C-order bytes of `region` of the sample array of shape `array`.
pub fn region_bytes(array: &[u64], region: &Region, elem_size: usize) -> Vec<u8> {
    let array_strides = geometry::strides(array);
    let mut bytes = Vec::with_capacity(region.volume() as usize * elem_size);
    let last = region.ndim() - 1;
    let rows: Vec<usize> = region.shape[..last].iter().map(|&n| n as usize).collect();
    for row in IndexBox::grid(&rows) {
        let mut base = region.origin[last];
        for d in 0..last {
            base += (region.origin[d] + row[d] as u64) * array_strides[d];
        }
        for x in 0..region.shape[last] {
            bytes.extend_from_slice(&splitmix64(base + x).to_le_bytes()[..elem_size]);
        }
    }
    bytes
}

/// Writes the sample array of shape `array` as blocks of `block` shape into
/// `dir` (created if missing), named `{i}_{j}_{k}.{ext}`; or, with
/// `single_file`, the whole array as that one file.
pub fn write_sample(
    dir: &Path,
    array: &[u64],
    block: &[u64],
    dtype: DType,
    format: BlockFormat,
    dataset: &str,
) -> Result<()> {
    if array.len() != block.len() {
        return Err(Error::BadArgument(format!(
            "--array {} and --blocks {} differ in dimensions",
            geometry::show_shape(array),
            geometry::show_shape(block)
        )));
    }
    if format.pads_edge_blocks() {
        return Err(Error::BadArgument(format!(
            "sample writes block files (h5 or npy); for a {} sample, rechunk one: \
             rechunkfs rechunk SAMPLE OUT --shape ... --format {}",
            format.name(),
            format.extension()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, "creating", e))?;
    let grid = Partition::regular(array, block);
    for index in IndexBox::grid(&grid.grid_shape()) {
        let region = grid.block(&index);
        let named = format.axis_order().to_user(&index);
        let path = dir.join(format!("{}.{}", grid_name(&named), format.extension()));
        write_block_file(&path, array, &region, dtype, format, dataset)?;
    }
    Ok(())
}

/// Writes one file holding `region` of the sample array.
pub fn write_block_file(
    path: &Path,
    array: &[u64],
    region: &Region,
    dtype: DType,
    format: BlockFormat,
    dataset: &str,
) -> Result<()> {
    use std::os::unix::fs::FileExt;
    // NIfTI headers place the block in the whole (identity voxel sizes).
    let space = crate::array::space::Space::identity(array.len());
    let template = format::template_in_space(format, &region.shape, dtype, dataset, 1, &space)?;
    let template = format::place(
        &template,
        format,
        &region.shape,
        dtype,
        &space,
        &region.origin,
    );
    let file = template.create_file(path)?;
    let data = region_bytes(array, region, dtype.size);
    file.write_all_at(&data, template.data_offset)
        .map_err(|e| Error::io(path, "writing", e))?;
    Ok(())
}

/// `sample`: writes a sample array as block files, shapes given in the
/// format's user-facing order.
pub(super) fn sample_command(args: crate::cli::args::SampleArgs) -> anyhow::Result<()> {
    use anyhow::Context;

    let dtype: DType = args.dtype.parse()?;
    let format: BlockFormat = args.format.parse()?;
    // Written as the format's readers will address it (see crate::array::axes).
    let order = format.axis_order();
    let array = order.to_internal(&parse_shape(&args.array).context("--array")?);
    let blocks = order.to_internal(&parse_shape(&args.blocks).context("--blocks")?);
    write_sample(&args.output, &array, &blocks, dtype, format, &args.dataset)?;
    eprintln!(
        "wrote a {} {} array as {} blocks of {} into {}",
        geometry::show_shape(&order.to_user(&array)),
        dtype,
        format.name(),
        geometry::show_shape(&order.to_user(&blocks)),
        args.output.display()
    );
    Ok(())
}
