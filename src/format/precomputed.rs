//! Neuroglancer precomputed volumes, unsharded, raw encoding: an `info`
//! JSON file with one scale per pyramid level (directory `key`), and each
//! chunk a file named by its voxel ranges, `x0-x1_y0-y1_z0-z1`, holding its
//! voxels with x fastest, then y, z and the channel.
//!
//! Precomputed's x is whatever axis moves fastest in the bytes, which is
//! the last internal C-order axis: for a C-order `(z, y, x)` array (HDF5,
//! npy, Zarr, MINC2's `zspace,yspace,xspace`) and for NIfTI, whose first
//! axis i is its fastest, the chunk's bytes are the block's C-order bytes
//! as they are, with no transpose. Arrays of fewer than three axes get
//! axes of length 1; a fourth, leading axis is the channel, and must be
//! whole in every chunk. Chunks are little-endian and of the types
//! Neuroglancer reads: other inputs are refused rather than converted.

use serde_json::{json, Value};

use super::ome::{ScaleLevel, WorldAxis};
use super::traits::{data_only_template, BlockNames, FormatTraits, PyramidKind};
use crate::array::dtype::{DType, Endian, Kind};
use crate::array::geometry::Region;
use crate::error::{Error, Result};

/// Neuroglancer's name for `dtype`, if it reads it.
fn data_type(dtype: DType) -> Option<&'static str> {
    match (dtype.kind, dtype.size) {
        (Kind::Unsigned, 1) => Some("uint8"),
        (Kind::Signed, 1) => Some("int8"),
        (Kind::Unsigned, 2) => Some("uint16"),
        (Kind::Signed, 2) => Some("int16"),
        (Kind::Unsigned, 4) => Some("uint32"),
        (Kind::Signed, 4) => Some("int32"),
        (Kind::Unsigned, 8) => Some("uint64"),
        (Kind::Float, 4) => Some("float32"),
        _ => None,
    }
}

/// Why an array of `shape` and `dtype` in blocks of `block` cannot be
/// written as precomputed chunks, if it cannot.
pub fn check(shape: &[u64], block: &[u64], dtype: DType) -> Result<()> {
    let refuse = |why: String| Err(Error::BadArgument(format!("--format precomputed: {why}")));
    if shape.len() > 4 {
        return refuse(format!(
            "the array has {} axes; precomputed holds x, y, z and a channel axis at most",
            shape.len()
        ));
    }
    if shape.len() == 4 && block[0] < shape[0] {
        return refuse(format!(
            "the first axis (the channel, {} long) must be whole in every chunk; give it a \
             --shape side of {} or more",
            shape[0], shape[0]
        ));
    }
    if data_type(dtype).is_none() {
        return refuse(format!(
            "Neuroglancer does not read {dtype}; it reads uint8, int8, uint16, int16, uint32, \
             int32, uint64 and float32 (rechunkfs moves bytes, it does not convert them)"
        ));
    }
    if dtype.size > 1 && dtype.endian == Endian::Big {
        return refuse(format!(
            "the input is {dtype}, and precomputed chunks are little-endian; rechunkfs moves \
             bytes without swapping them: write zarr3, which records the byte order"
        ));
    }
    Ok(())
}

/// `(x, y, z)` of an internal C-order vector: its last three entries
/// reversed, `fill` where the array has fewer axes.
fn xyz<T: Copy>(values: &[T], fill: T) -> [T; 3] {
    let n = values.len();
    let at = |i: usize| if i < n { values[n - 1 - i] } else { fill };
    [at(0), at(1), at(2)]
}

/// The file name of the chunk holding `region` (internal order).
pub fn chunk_name(region: &Region) -> String {
    let starts = xyz(&region.origin, 0);
    let ends: Vec<u64> = (0..region.ndim()).map(|d| region.end(d)).collect();
    let ends = xyz(&ends, 1);
    format!(
        "{}-{}_{}-{}_{}-{}",
        starts[0], ends[0], starts[1], ends[1], starts[2], ends[2]
    )
}

/// The `(start, end)` ranges a chunk name gives, x first; `None` if `name`
/// is not one (numbers without leading zeros).
pub fn parse_chunk_name(name: &str) -> Option<[(u64, u64); 3]> {
    let number = |text: &str| -> Option<u64> {
        let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        (digits && (text.len() == 1 || !text.starts_with('0')))
            .then(|| text.parse().ok())
            .flatten()
    };
    let mut ranges = [(0, 0); 3];
    let mut parts = name.split('_');
    for range in &mut ranges {
        let (start, end) = parts.next()?.split_once('-')?;
        *range = (number(start)?, number(end)?);
    }
    parts.next().is_none().then_some(ranges)
}

/// Nanometres per `unit` (an OME-Zarr unit name); unknown units are taken
/// as nanometres.
fn nanometres(unit: Option<&str>) -> f64 {
    match unit {
        Some("meter") => 1e9,
        Some("millimeter") => 1e6,
        Some("micrometer") => 1e3,
        _ => 1.0,
    }
}

/// The `info` file of a volume whose level `k` is in directory `k`.
pub fn info(axes: &[WorldAxis], levels: &[ScaleLevel], dtype: DType, labels: bool) -> Vec<u8> {
    let ndim = axes.len();
    let channels = if ndim == 4 { levels[0].shape[0] } else { 1 };
    let scales: Vec<Value> = levels
        .iter()
        .enumerate()
        .map(|(k, level)| {
            let resolution: Vec<f64> = (0..ndim)
                .map(|d| {
                    let axis = &axes[d];
                    axis.scale.abs() * level.factor[d] as f64 * nanometres(axis.unit)
                })
                .collect();
            json!({
                "key": k.to_string(),
                "size": xyz(&level.shape, 1),
                "resolution": xyz(&resolution, 1.0),
                "voxel_offset": [0, 0, 0],
                "chunk_sizes": [xyz(&level.block, 1)],
                "encoding": "raw",
            })
        })
        .collect();
    let value = json!({
        "@type": "neuroglancer_multiscale_volume",
        "type": if labels { "segmentation" } else { "image" },
        "data_type": data_type(dtype).unwrap_or("uint8"),
        "num_channels": channels,
        "scales": scales,
    });
    let mut bytes = serde_json::to_vec_pretty(&value).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Whether a volume of `dtype` downsampled by a label rule is shown as
/// segmentation: Neuroglancer's segmentation layers read uint32 and uint64.
pub fn is_segmentation(dtype: DType, labels: bool) -> bool {
    labels && dtype.kind == Kind::Unsigned && matches!(dtype.size, 4 | 8)
}

/// Neuroglancer precomputed's row of the format table: written only,
/// chunks named by their voxel ranges, always a pyramid of scales.
pub(super) const TRAITS: FormatTraits = FormatTraits {
    name: "Neuroglancer precomputed",
    extension: "precomputed",
    aliases: &["precomputed"],
    names: BlockNames::VoxelRanges,
    probe: Err("rechunkfs writes Neuroglancer precomputed volumes but does not read them"),
    template: Ok(data_only_template),
    pyramid: PyramidKind::Precomputed,
    ..FormatTraits::NONE
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_names_are_x_first_and_parse_back() {
        let region = Region::new(vec![10, 20, 30], vec![5, 6, 7]);
        assert_eq!(chunk_name(&region), "30-37_20-26_10-15");
        assert_eq!(
            parse_chunk_name("30-37_20-26_10-15"),
            Some([(30, 37), (20, 26), (10, 15)])
        );
        let flat = Region::new(vec![4, 8], vec![4, 8]);
        assert_eq!(chunk_name(&flat), "8-16_4-8_0-1");
        for bad in [
            "",
            "1-2_3-4",
            "01-2_3-4_5-6",
            "1-2_3-4_5-6_7-8",
            "a-b_c-d_e-f",
        ] {
            assert_eq!(parse_chunk_name(bad), None, "{bad}");
        }
    }
}
