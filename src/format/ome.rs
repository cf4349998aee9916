//! Where a multiscale pyramid's levels lie in the world, and the metadata
//! viewers read it from: OME-Zarr's `multiscales` (0.4 for Zarr v2, in the
//! group's `.zattrs`; 0.5 for Zarr v3, under `ome` in the group's
//! `zarr.json` attributes).
//!
//! Each axis gets a name, a type (space, time or channel), a unit, and a
//! scale and translation, from the input's world space ([`Space`], NIfTI
//! and MINC2 headers) or voxel size 1 at the origin. OME-Zarr has no
//! rotation: an affine with one is described by its voxel sizes and its
//! origin, and said so on stderr by the caller. A level whose voxels are
//! `s_k` long has its first voxel's centre at `t_0 + (s_k - s_0) / 2`:
//! voxel centres, as OME-Zarr viewers place them.
//!
//! The `omero` block gives viewers a display window: the range of level
//! 0's values, gathered by [`Window`] from voxels read anyway, so that a
//! uint16 image opens with its own contrast instead of 0–65535.

use half::f16;
use serde_json::{json, Value};

use crate::array::dtype::{DType, Endian, Kind};
use crate::array::space::Space;
use crate::error::{Error, Result};

/// One level of a pyramid, in internal C order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleLevel {
    pub shape: Vec<u64>,
    pub block: Vec<u64>,
    /// Its voxel's length in level-0 voxels, per axis.
    pub factor: Vec<u64>,
}

/// One axis of the array as a viewer sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct WorldAxis {
    pub name: &'static str,
    /// `space`, `time` or `channel`.
    pub kind: &'static str,
    pub unit: Option<&'static str>,
    /// Level 0's voxel step along the axis, in `unit`.
    pub scale: f64,
    /// Level 0's first voxel centre along the axis.
    pub translation: f64,
}

/// The axes of an array of `ndim` dimensions in `space` (internal order).
/// `leading_is_time`: the first non-spatial axis is time (NIfTI's fourth
/// axis), not channels. Also whether the affine had a rotation that the
/// axes cannot carry.
pub fn world_axes(
    space: &Space,
    ndim: usize,
    leading_is_time: bool,
) -> Result<(Vec<WorldAxis>, bool)> {
    let spatial = ndim.min(3);
    let leading = ndim - spatial;
    if leading > 2 {
        return Err(Error::BadArgument(format!(
            "a {ndim}-dimensional array has more axes than OME-Zarr and Neuroglancer \
             describe (time, channel and three spatial axes at most)"
        )));
    }
    let names = ["x", "y", "z"];
    let space_unit = match space.xyzt_units & 0x07 {
        1 => Some("meter"),
        2 => Some("millimeter"),
        3 => Some("micrometer"),
        _ => None,
    };
    let time_unit = match space.xyzt_units & 0x38 {
        8 => Some("second"),
        16 => Some("millisecond"),
        24 => Some("microsecond"),
        _ => None,
    };
    let mut rotated = false;
    let mut axes = Vec::with_capacity(ndim);
    for d in 0..ndim {
        let nifti_axis = ndim - 1 - d;
        if d < leading {
            let time = leading_is_time && d == 0;
            axes.push(WorldAxis {
                name: if time { "t" } else { "c" },
                kind: if time { "time" } else { "channel" },
                unit: if time { time_unit } else { None },
                scale: if time {
                    space.zooms.get(nifti_axis).copied().unwrap_or(1.0)
                } else {
                    1.0
                },
                translation: 0.0,
            });
            continue;
        }
        let row = &space.affine[nifti_axis];
        let off_diagonal = (0..spatial).any(|c| c != nifti_axis && row[c] != 0.0);
        rotated |= off_diagonal;
        let scale = if off_diagonal {
            space.zooms.get(nifti_axis).copied().unwrap_or(1.0)
        } else {
            row[nifti_axis]
        };
        axes.push(WorldAxis {
            name: names[nifti_axis],
            kind: "space",
            unit: space_unit,
            scale,
            translation: row[3],
        });
    }
    Ok((axes, rotated))
}

/// Scale and translation of `level` along each axis.
fn transforms(axes: &[WorldAxis], level: &ScaleLevel) -> (Vec<f64>, Vec<f64>) {
    axes.iter()
        .zip(&level.factor)
        .map(|(axis, &f)| {
            let scale = axis.scale * f as f64;
            (scale, axis.translation + (scale - axis.scale) / 2.0)
        })
        .unzip()
}

/// The smallest and largest value seen: a display window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    pub min: f64,
    pub max: f64,
}

/// Gathers the range of values of one dtype; NaNs are left out.
#[derive(Clone, Copy, Debug)]
pub struct WindowOf {
    dtype: DType,
    seen: Option<Window>,
}

impl WindowOf {
    pub fn new(dtype: DType) -> WindowOf {
        WindowOf { dtype, seen: None }
    }

    /// Goes on from `window`, a range seen before (by an earlier run).
    pub fn seen(mut self, window: Option<Window>) -> WindowOf {
        self.seen = window;
        self
    }

    /// Takes in `window`, a range seen elsewhere.
    pub fn include(&mut self, window: Option<Window>) {
        if let Some(w) = window {
            self.widen(w.min, w.max);
        }
    }

    /// Takes in whole elements of `bytes` (a trailing partial one is ignored).
    pub fn observe(&mut self, bytes: &[u8]) {
        let big = self.dtype.endian == Endian::Big;
        // One loop per element type, in that type: it sees every voxel of
        // level 0, so a conversion per voxel would cost more than the
        // downsampling it rides along with.
        let range = match (self.dtype.kind, self.dtype.size) {
            (Kind::Unsigned, 1) => range_of(bytes, big, u8::from_le_bytes, u8::from_be_bytes),
            (Kind::Unsigned, 2) => range_of(bytes, big, u16::from_le_bytes, u16::from_be_bytes),
            (Kind::Unsigned, 4) => range_of(bytes, big, u32::from_le_bytes, u32::from_be_bytes),
            (Kind::Unsigned, _) => range_of(bytes, big, u64::from_le_bytes, u64::from_be_bytes),
            (Kind::Signed, 1) => range_of(bytes, big, i8::from_le_bytes, i8::from_be_bytes),
            (Kind::Signed, 2) => range_of(bytes, big, i16::from_le_bytes, i16::from_be_bytes),
            (Kind::Signed, 4) => range_of(bytes, big, i32::from_le_bytes, i32::from_be_bytes),
            (Kind::Signed, _) => range_of(bytes, big, i64::from_le_bytes, i64::from_be_bytes),
            (Kind::Float, 2) => range_of(bytes, big, f16::from_le_bytes, f16::from_be_bytes),
            (Kind::Float, 4) => range_of(bytes, big, f32::from_le_bytes, f32::from_be_bytes),
            (Kind::Float, _) => range_of(bytes, big, f64::from_le_bytes, f64::from_be_bytes),
        };
        if let Some((lo, hi)) = range {
            self.widen(lo, hi);
        }
    }

    /// Widens the range seen to take in `lo..=hi`, if finite.
    fn widen(&mut self, lo: f64, hi: f64) {
        let (lo, hi) = match self.seen {
            Some(w) => (w.min.min(lo), w.max.max(hi)),
            None => (lo, hi),
        };
        if lo <= hi && lo.is_finite() && hi.is_finite() {
            self.seen = Some(Window { min: lo, max: hi });
        }
    }

    /// The range seen, if any finite value was.
    pub fn window(&self) -> Option<Window> {
        self.seen
    }
}

/// A value of an element type whose range a window gathers.
trait Ranged: Copy + PartialOrd {
    /// Whether the least and greatest are the same values in any order
    /// of scanning (not so for floats: 0.0 and -0.0 compare equal).
    const ANY_ORDER: bool;
    fn to_f64(self) -> f64;
}

macro_rules! ranged {
    ($any_order:expr; $($t:ty),*) => {$(
        impl Ranged for $t {
            const ANY_ORDER: bool = $any_order;
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    )*};
}
ranged!(true; u8, u16, u32, u64, i8, i16, i32, i64);
ranged!(false; f32, f64);

impl Ranged for f16 {
    const ANY_ORDER: bool = false;
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
}

/// The least and greatest of the whole `N`-byte elements of `bytes`
/// (NaNs left out: every comparison with one is false), as f64.
fn range_of<T: Ranged, const N: usize>(
    bytes: &[u8],
    big: bool,
    from_le: impl Fn([u8; N]) -> T,
    from_be: impl Fn([u8; N]) -> T,
) -> Option<(f64, f64)> {
    // Each byte order its own loop, the conversion inlined in it.
    if big {
        range_in(bytes, from_be)
    } else {
        range_in(bytes, from_le)
    }
}

fn range_in<T: Ranged, const N: usize>(
    bytes: &[u8],
    load: impl Fn([u8; N]) -> T,
) -> Option<(f64, f64)> {
    let value_of = |element: &[u8]| {
        let mut raw = [0u8; N];
        raw.copy_from_slice(element);
        load(raw)
    };
    let mut values = bytes.chunks_exact(N).map(&value_of);
    // The first value that is not NaN starts the range.
    let first = values.by_ref().find(|v| v.partial_cmp(v).is_some())?;
    let (mut lo, mut hi) = (first, first);
    if T::ANY_ORDER {
        // In lanes the compiler can keep in vector registers.
        const LANES: usize = 32;
        let rest = &bytes[bytes.len() - values.len() * N..];
        let groups = rest.chunks_exact(LANES * N);
        let tail = groups.remainder();
        let (mut los, mut his) = ([first; LANES], [first; LANES]);
        for group in groups {
            for (i, element) in group.chunks_exact(N).enumerate() {
                let value = value_of(element);
                if value < los[i] {
                    los[i] = value;
                }
                if value > his[i] {
                    his[i] = value;
                }
            }
        }
        values = tail.chunks_exact(N).map(&value_of);
        for (&l, &h) in los.iter().zip(&his) {
            if l < lo {
                lo = l;
            }
            if h > hi {
                hi = h;
            }
        }
    }
    for value in values {
        if value < lo {
            lo = value;
        }
        if value > hi {
            hi = value;
        }
    }
    Some((lo.to_f64(), hi.to_f64()))
}

/// A precomputed `info` with `window` as `rechunkfs.window` (`[min,
/// max]`), the one place that format has for it; Neuroglancer and
/// TensorStore read past members they do not know. Unchanged without a
/// window, or if it does not parse.
pub fn with_window(info: Vec<u8>, window: Option<Window>) -> Vec<u8> {
    let Some(window) = window else {
        return info;
    };
    let Ok(mut value) = serde_json::from_slice::<Value>(&info) else {
        return info;
    };
    value["rechunkfs"] = json!({ "window": [number(window.min), number(window.max)] });
    let mut bytes = serde_json::to_vec_pretty(&value).unwrap_or(info);
    bytes.push(b'\n');
    bytes
}

/// OME-Zarr's `omero` block: one greyscale channel per channel of the
/// image (its `c` axis, else one), each shown over `window`.
fn omero(axes: &[WorldAxis], shape: &[u64], window: Window, v04: bool) -> Value {
    let channels = axes
        .iter()
        .zip(shape)
        .find(|(axis, _)| axis.kind == "channel")
        .map_or(1, |(_, &n)| n);
    let channel = |c: u64| {
        json!({
            "label": format!("channel {c}"),
            "active": true,
            "color": "FFFFFF",
            "coefficient": 1,
            "family": "linear",
            "inverted": false,
            "window": { "min": number(window.min), "max": number(window.max),
                        "start": number(window.min), "end": number(window.max) },
        })
    };
    let mut value = json!({
        "channels": (0..channels).map(channel).collect::<Vec<_>>(),
        "rdefs": { "model": "greyscale" },
    });
    if v04 {
        value["version"] = json!("0.4");
    }
    value
}

/// `x` in JSON, whole numbers without a fraction (integer images' windows).
fn number(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        json!(x as i64)
    } else {
        json!(x)
    }
}

/// The `multiscales` entry for levels stored in directories `0`, `1`, …
fn multiscale(axes: &[WorldAxis], levels: &[ScaleLevel], method: &str, v04: bool) -> Value {
    let axes_json: Vec<Value> = axes
        .iter()
        .map(|axis| {
            let mut value = json!({ "name": axis.name, "type": axis.kind });
            if let Some(unit) = axis.unit {
                value["unit"] = json!(unit);
            }
            value
        })
        .collect();
    let datasets: Vec<Value> = levels
        .iter()
        .enumerate()
        .map(|(k, level)| {
            let (scale, translation) = transforms(axes, level);
            json!({
                "path": k.to_string(),
                "coordinateTransformations": [
                    { "type": "scale", "scale": scale },
                    { "type": "translation", "translation": translation },
                ],
            })
        })
        .collect();
    let mut entry = json!({
        "name": "rechunkfs",
        "axes": axes_json,
        "datasets": datasets,
        "type": method,
        "metadata": { "description": format!("downsampled by {method}, as TensorStore's downsample") },
    });
    if v04 {
        entry["version"] = json!("0.4");
    }
    entry
}

/// The OME-Zarr group files at the root of a pyramid whose level `k` is
/// the Zarr array in directory `k`: `.zgroup` and `.zattrs` (OME-Zarr 0.4)
/// for Zarr v2, or `zarr.json` (0.5) for Zarr v3.
pub fn group_files(
    axes: &[WorldAxis],
    levels: &[ScaleLevel],
    method: &str,
    zarr3: bool,
    window: Option<Window>,
) -> Vec<(&'static str, Vec<u8>)> {
    let pretty = |value: Value| {
        let mut bytes = serde_json::to_vec_pretty(&value).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    };
    let shape = levels.first().map_or(&[][..], |level| &level.shape[..]);
    if zarr3 {
        let mut ome =
            json!({ "version": "0.5", "multiscales": [multiscale(axes, levels, method, false)] });
        if let Some(window) = window {
            ome["omero"] = omero(axes, shape, window, false);
        }
        let attributes = json!({ "ome": ome });
        vec![(
            "zarr.json",
            pretty(json!({ "zarr_format": 3, "node_type": "group", "attributes": attributes })),
        )]
    } else {
        let mut attributes = json!({ "multiscales": [multiscale(axes, levels, method, true)] });
        if let Some(window) = window {
            attributes["omero"] = omero(axes, shape, window, true);
        }
        vec![
            (".zgroup", pretty(json!({ "zarr_format": 2 }))),
            (".zattrs", pretty(attributes)),
        ]
    }
}

/// An OME-Zarr group file from [`group_files`] made without a window
/// (`.zattrs`, or the Zarr v3 group's `zarr.json`; others are returned
/// unchanged) with `window`'s `omero` block: what a view serves once the
/// window is known. Unchanged without a window, or if it does not parse.
pub fn with_omero(
    file: Vec<u8>,
    axes: &[WorldAxis],
    shape: &[u64],
    window: Option<Window>,
) -> Vec<u8> {
    let Some(window) = window else {
        return file;
    };
    let Ok(mut value) = serde_json::from_slice::<Value>(&file) else {
        return file;
    };
    if value["attributes"]["ome"].is_object() {
        value["attributes"]["ome"]["omero"] = omero(axes, shape, window, false);
    } else if value["multiscales"].is_array() {
        value["omero"] = omero(axes, shape, window, true);
    } else {
        return file;
    }
    let mut bytes = serde_json::to_vec_pretty(&value).unwrap_or(file);
    bytes.push(b'\n');
    bytes
}

/// A Zarr v3 array's `zarr.json` with `dimension_names`, which OME-Zarr 0.5
/// asks to match the axes' names (unchanged if it does not parse).
pub fn with_dimension_names(zarr_json: Vec<u8>, axes: &[WorldAxis]) -> Vec<u8> {
    let Ok(mut value) = serde_json::from_slice::<Value>(&zarr_json) else {
        return zarr_json;
    };
    value["dimension_names"] = json!(axes.iter().map(|a| a.name).collect::<Vec<_>>());
    let mut bytes = serde_json::to_vec_pretty(&value).unwrap_or(zarr_json);
    bytes.push(b'\n');
    bytes
}

/// Refuses an array OME-Zarr cannot hold as an image: fewer than 2 axes.
pub fn check_axes(ndim: usize) -> Result<()> {
    if ndim < 2 {
        return Err(Error::BadArgument(format!(
            "an OME-Zarr image has 2 axes or more; this array has {ndim}: drop --levels"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_reads_each_type_and_byte_order_and_skips_nan() {
        let range = |descr: &str, bytes: &[u8]| {
            let mut window = WindowOf::new(descr.parse().unwrap());
            window.observe(bytes);
            window.window().map(|w| (w.min, w.max))
        };
        assert_eq!(
            range("<i2", &[0x00, 0x80, 0xff, 0x7f]),
            Some((-32768.0, 32767.0))
        );
        assert_eq!(
            range(">i2", &[0x80, 0x00, 0x00, 0x05]),
            Some((-32768.0, 5.0))
        );
        assert_eq!(range(">u4", &[0, 0, 1, 0, 0, 0, 0, 7]), Some((7.0, 256.0)));
        assert_eq!(range("|i1", &[0xfe, 0x03]), Some((-2.0, 3.0)));
        let mut f4 = Vec::new();
        for x in [f32::NAN, -1.5, 2.25] {
            f4.extend(x.to_le_bytes());
        }
        assert_eq!(range("<f4", &f4), Some((-1.5, 2.25)));
        assert_eq!(range("<f4", &f32::NAN.to_le_bytes()), None);
        let f2: Vec<u8> = [f16::from_f32(-0.5), f16::from_f32(8.0)]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(range("<f2", &f2), Some((-0.5, 8.0)));
    }

    #[test]
    fn a_window_over_many_values_is_their_least_and_greatest() {
        let mut state = 7u64;
        for len in [1usize, 2, 31, 32, 33, 65, 1000] {
            let values: Vec<i16> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    (state >> 48) as i16
                })
                .collect();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_be_bytes()).collect();
            let mut window = WindowOf::new(">i2".parse().unwrap());
            window.observe(&bytes);
            let seen = window.window().unwrap();
            assert_eq!(seen.min, *values.iter().min().unwrap() as f64, "{len}");
            assert_eq!(seen.max, *values.iter().max().unwrap() as f64, "{len}");
        }
    }

    #[test]
    fn a_window_added_later_gives_the_group_files_made_with_it() {
        let (axes, _) = world_axes(&Space::identity(3), 3, false).unwrap();
        let levels = [ScaleLevel {
            shape: vec![4, 6, 8],
            block: vec![2, 3, 4],
            factor: vec![1, 1, 1],
        }];
        let window = Window {
            min: -3.0,
            max: 7.5,
        };
        for zarr3 in [false, true] {
            let with = group_files(&axes, &levels, "mean", zarr3, Some(window));
            let without = group_files(&axes, &levels, "mean", zarr3, None);
            for ((name, later), (_, made)) in without.into_iter().zip(with) {
                let later = with_omero(later, &axes, &levels[0].shape, Some(window));
                assert_eq!(later, made, "{name}");
            }
        }
    }

    #[test]
    fn a_downsampled_level_is_shifted_by_half_its_new_voxel() {
        let mut space = Space::identity(3);
        space.affine[0] = [2.0, 0.0, 0.0, 10.0]; // x: 2 mm voxels from 10
        space.xyzt_units = 2;
        let (axes, rotated) = world_axes(&space, 3, false).unwrap();
        assert!(!rotated);
        assert_eq!(axes[2].name, "x");
        assert_eq!(axes[2].unit, Some("millimeter"));
        let level = ScaleLevel {
            shape: vec![5, 5, 5],
            block: vec![5, 5, 5],
            factor: vec![2, 2, 4],
        };
        let (scale, translation) = transforms(&axes, &level);
        assert_eq!(scale, vec![2.0, 2.0, 8.0]);
        // x: centres of voxels 0..4 of level 0 are at 10, 12, 14, 16: their mean is 13.
        assert_eq!(translation, vec![0.5, 0.5, 13.0]);
    }
}
