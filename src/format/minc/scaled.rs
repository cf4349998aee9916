//! A MINC2 integer image's physical values, as nibabel's `get_fdata`
//! computes them: each stored value clipped to the image's `valid_range`
//! (the dtype's range when absent), then mapped linearly from that range
//! onto `[image-min, image-max]`. `image-min` and `image-max` are scalars,
//! or vary along the image's first one or two dimensions (their own
//! `dimorder` names them), one pair per slice.
//!
//! The arithmetic is nibabel's, in its order, in f64:
//! `slope = (max - min) / (vmax - vmin)`, `inter = min - vmin * slope`,
//! `value = clip(stored) * slope + inter` (a product rounded, then a sum
//! rounded: never a fused multiply-add), rounded once to the output type.
//!
//! Scaled blocks are encoded input ([`BlockDecode`]): each file is read
//! whole through libhdf5 (minc-tools write chunked, compressed images) and
//! converted in the buffer it was read into, so the decoded block is the
//! only array memory held.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use ::hdf5::sync::sync;

use super::attrs::{dtype_range, library_error, numbers_attr, string_attr, IMAGE, IMAGE_GROUP};
use crate::array::dtype::{DType, Endian, Kind};
use crate::error::{Error, Result};
use crate::format::block::shape_text;
use crate::format::decode::{most_at_ratio, zeroed, BlockDecode, DEFLATE_RATIO};
use crate::format::hdf5::Hdf5BlockReader;

/// How a MINC2 file's stored values become its physical values.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueScaling {
    /// A float image: its stored values are its values.
    Float,
    /// An integer image without `image-min`/`image-max` (nibabel cannot
    /// load it; libminc takes the stored values as they are).
    Absent,
    /// Slope 1, intercept 0 and the dtype's whole range as the valid
    /// range: the stored values are the values.
    Identity,
    /// One slope and intercept for the whole image.
    Global { slope: f64, inter: f64 },
    /// A slope and intercept per slice: `entries` pairs.
    PerSlice { entries: usize },
}

/// The scaling of an integer image, as read from its file.
pub(super) struct ScaleTable {
    /// The image's shape.
    shape: Vec<u64>,
    /// The leading image dimensions the pairs vary along (0, 1 or 2).
    dims: usize,
    /// One (slope, intercept) per entry, C order over those dimensions.
    pairs: Vec<(f64, f64)>,
    /// The valid range the stored values are clipped to.
    valid: (f64, f64),
}

impl ScaleTable {
    pub(super) fn scaling(&self, dtype: DType) -> ValueScaling {
        match self.pairs.first() {
            Some(&(slope, inter)) if self.pairs.iter().all(|&p| p == (slope, inter)) => {
                if (slope, inter) == (1.0, 0.0) && self.valid == dtype_range(dtype) {
                    ValueScaling::Identity
                } else {
                    ValueScaling::Global { slope, inter }
                }
            }
            _ => ValueScaling::PerSlice {
                entries: self.pairs.len(),
            },
        }
    }
}

/// How the MINC2 file at `path`, whose image is of `dtype`, scales its
/// values. What nibabel refuses (image-min and image-max along different
/// dimensions, or along more than two, or not the image's first ones; a
/// valid range outside the dtype's) is refused here too.
pub fn value_scaling(path: &Path, dtype: DType) -> Result<ValueScaling> {
    if dtype.kind == Kind::Float {
        return Ok(ValueScaling::Float);
    }
    let table = sync(|| {
        let file = ::hdf5::File::with_options()
            .with_fapl(|fapl| fapl.sieve_buf_size(0))
            .open(path)
            .map_err(|e| library_error(path, "the file", e))?;
        read_table(&file, path, dtype)
    })?;
    Ok(table.map_or(ValueScaling::Absent, |table| table.scaling(dtype)))
}

/// One of `image-min`, `image-max`: the dimensions it varies along (its
/// `dimorder`, cut to its rank, as nibabel cuts it), its shape and values.
struct ScaleVariable {
    dims: Vec<String>,
    shape: Vec<u64>,
    values: Vec<f64>,
}

/// Its values are read only if it has at most `most` of them: its shape is
/// a claim, checked before it sizes the buffer.
fn read_variable(
    file: &::hdf5::File,
    path: &Path,
    name: &str,
    most: u64,
) -> Result<Option<ScaleVariable>> {
    let Ok(dataset) = file.dataset(&format!("{IMAGE_GROUP}/{name}")) else {
        return Ok(None);
    };
    let count = dataset.shape().iter().map(|&n| n as u64).product::<u64>();
    if count > most {
        return Err(Error::bad_input(
            path,
            format!(
                "its {name} claims {count} values, more than the {most} its image's slices \
                 and its file's bytes can hold; the file is damaged"
            ),
        ));
    }
    let read = || -> ::hdf5::Result<ScaleVariable> {
        let shape: Vec<u64> = dataset.shape().iter().map(|&n| n as u64).collect();
        let dims = string_attr(&dataset, "dimorder")?
            .map(|order| order.split(',').map(|d| d.trim().to_owned()).collect())
            .unwrap_or_else(Vec::new)
            .into_iter()
            .take(shape.len())
            .collect();
        Ok(ScaleVariable {
            dims,
            shape,
            values: dataset.read_raw::<f64>()?,
        })
    };
    read().map(Some).map_err(|e| library_error(path, name, e))
}

/// The image's scaling (`None` without image-min/image-max).
pub(super) fn read_table(
    file: &::hdf5::File,
    path: &Path,
    dtype: DType,
) -> Result<Option<ScaleTable>> {
    let image = file
        .dataset(IMAGE)
        .map_err(|e| library_error(path, IMAGE, e))?;
    let shape: Vec<u64> = image.shape().iter().map(|&n| n as u64).collect();
    let image_dims: Vec<String> = string_attr(&image, "dimorder")
        .map_err(|e| library_error(path, "the image's dimorder", e))?
        .map(|order| order.split(',').map(|d| d.trim().to_owned()).collect())
        .unwrap_or_default();
    // One value per slice of the first two dimensions at most, each 8
    // bytes the file holds (deflated at most 1032:1).
    let file_len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    let most = shape
        .iter()
        .take(2)
        .product::<u64>()
        .min(most_at_ratio(file_len, DEFLATE_RATIO) / 8);
    let minimum = read_variable(file, path, "image-min", most)?;
    let maximum = read_variable(file, path, "image-max", most)?;
    let (Some(minimum), Some(maximum)) = (minimum, maximum) else {
        return Ok(None);
    };
    let refuse = |problem: String| Err(Error::bad_input(path, problem));
    if minimum.dims != maximum.dims {
        return refuse(format!(
            "its image-min varies along ({}) but its image-max along ({}); nibabel and \
             rechunkfs need them to vary alike",
            minimum.dims.join(","),
            maximum.dims.join(",")
        ));
    }
    let dims = minimum.dims.len();
    if dims > 2 || dims > shape.len() || image_dims.get(..dims) != Some(&minimum.dims[..]) {
        return refuse(format!(
            "its image-min/image-max vary along ({}), which are not the first one or two of \
             the image's dimensions ({})",
            minimum.dims.join(","),
            image_dims.join(",")
        ));
    }
    for variable in [&minimum, &maximum] {
        let expected = shape[..dims].iter().product::<u64>();
        if variable.shape != shape[..dims] || variable.values.len() as u64 != expected {
            return refuse(format!(
                "its image-min/image-max have shape {} where the image's first {dims} \
                 dimensions are {}",
                shape_text(&variable.shape),
                shape_text(&shape[..dims])
            ));
        }
    }
    let valid = valid_range(&image, path, dtype)?;
    let pairs = minimum
        .values
        .iter()
        .zip(&maximum.values)
        .map(|(&low, &high)| {
            let slope = (high - low) / (valid.1 - valid.0);
            (slope, low - valid.0 * slope)
        })
        .collect();
    Ok(Some(ScaleTable {
        shape,
        dims,
        pairs,
        valid,
    }))
}

/// The image's `valid_range`, else its dtype's range, as nibabel takes it.
fn valid_range(image: &::hdf5::Dataset, path: &Path, dtype: DType) -> Result<(f64, f64)> {
    let (low, high) = dtype_range(dtype);
    match numbers_attr(image, "valid_range").map_err(|e| library_error(path, "valid_range", e))? {
        None => Ok((low, high)),
        Some(range) => match range[..] {
            [min, max, ..] if min >= low && max <= high => Ok((min, max)),
            _ => Err(Error::bad_input(
                path,
                format!(
                    "its image's valid_range {range:?} is not a range inside its {dtype} values \
                     ({low} to {high})"
                ),
            )),
        },
    }
}

/// The dtype of a scaled image of stored `dtype`: float32, native byte
/// order (float64 for eight-byte integers, so that the conversion fits in
/// the buffer the stored values were read into).
pub fn scaled_dtype(stored: DType) -> DType {
    let endian = if cfg!(target_endian = "big") {
        Endian::Big
    } else {
        Endian::Little
    };
    DType {
        kind: Kind::Float,
        size: if stored.size > 4 { 8 } else { 4 },
        endian,
    }
}

/// The decoder of a MINC2 file holding `file_shape` of `stored` integers,
/// into its physical values as a block of `padded_shape` (the input's block
/// shape: edge files are padded to it, as an encoded input's are).
pub fn scaled_decoder(
    file_shape: Vec<u64>,
    padded_shape: Vec<u64>,
    stored: DType,
) -> Arc<dyn BlockDecode> {
    Arc::new(ScaledMinc {
        file_shape,
        padded_shape,
        stored,
    })
}

/// Reads a MINC2 integer image and scales it ([`scaled_decoder`]).
#[derive(Debug)]
struct ScaledMinc {
    file_shape: Vec<u64>,
    padded_shape: Vec<u64>,
    stored: DType,
}

impl BlockDecode for ScaledMinc {
    fn decode(&self, path: &Path, _encoded: &[u8]) -> Result<Vec<u8>> {
        Err(Error::Hdf5 {
            path: path.to_path_buf(),
            message: "a MINC2 image is read through libhdf5, not decoded from the file's bytes"
                .into(),
        })
    }

    fn read_encoded(&self, _: &Path, _: &File, _: u64, _: u64) -> Result<Option<Vec<u8>>> {
        // libhdf5 reads the image: `read_decoded`.
        Ok(None)
    }

    fn read_decoded(&self, path: &Path, _file: &File, _offset: u64, _len: u64) -> Result<Vec<u8>> {
        let reader = Hdf5BlockReader::open(path, IMAGE)?;
        if reader.shape() != self.file_shape || reader.dtype() != self.stored {
            return Err(Error::bad_input(
                path,
                format!(
                    "changed since the scan: its image is now {} {} where {} {} was scanned",
                    shape_text(reader.shape()),
                    reader.dtype(),
                    shape_text(&self.file_shape),
                    self.stored
                ),
            ));
        }
        let table = sync(|| {
            let file = ::hdf5::File::with_options()
                .with_fapl(|fapl| fapl.sieve_buf_size(0))
                .open(path)
                .map_err(|e| library_error(path, "the file", e))?;
            read_table(&file, path, self.stored)
        })?
        .filter(|table| table.shape == self.file_shape)
        .ok_or_else(|| {
            Error::bad_input(
                path,
                "changed while being read: its image-min/image-max are gone, or its image has \
                 another shape",
            )
        })?;
        let mut block = zeroed(path, self.decoded_len())?;
        let volume: u64 = self.padded_shape.iter().product();
        let stored_len = (volume * self.stored.size as u64) as usize;
        let origin = vec![0; self.file_shape.len()];
        reader.read_box(
            &origin,
            &self.file_shape,
            &mut block[..stored_len],
            &self.padded_shape,
            &origin,
        )?;
        self.scale_in_place(&mut block, &table);
        Ok(block)
    }

    fn decoded_len(&self) -> u64 {
        let out = scaled_dtype(self.stored).size as u64;
        self.padded_shape.iter().product::<u64>() * out
    }

    fn describe(&self) -> String {
        format!(
            "MINC2 {} scaled to {} ({} in blocks of {})",
            self.stored,
            scaled_dtype(self.stored),
            shape_text(&self.file_shape),
            shape_text(&self.padded_shape)
        )
    }
}

impl ScaledMinc {
    /// Converts the stored values at the front of `block` (the padded
    /// shape's elements, `stored.size` bytes each) into scaled values
    /// filling it, last element first: an output element never starts
    /// before its stored one, so nothing is overwritten before it is read.
    /// Padding (outside the file's shape) is left as whatever it becomes.
    fn scale_in_place(&self, block: &mut [u8], table: &ScaleTable) {
        let (size, out) = (self.stored.size, scaled_dtype(self.stored).size);
        let read = stored_reader(self.stored);
        let slab: usize = self.padded_shape[table.dims..].iter().product::<u64>() as usize;
        let slabs: usize = self.padded_shape[..table.dims].iter().product::<u64>() as usize;
        let (low, high) = table.valid;
        for s in (0..slabs).rev() {
            let (slope, inter) = self.pair_of_slab(s, table);
            for i in (s * slab..(s + 1) * slab).rev() {
                let stored = read(&block[i * size..(i + 1) * size]);
                let value = stored.max(low).min(high) * slope + inter;
                let target = &mut block[i * out..(i + 1) * out];
                if out == 4 {
                    target.copy_from_slice(&(value as f32).to_ne_bytes());
                } else {
                    target.copy_from_slice(&value.to_ne_bytes());
                }
            }
        }
    }

    /// The (slope, intercept) of slab `s` (C order over the padded shape's
    /// first `table.dims` dimensions); zeros for a slab of padding.
    fn pair_of_slab(&self, s: usize, table: &ScaleTable) -> (f64, f64) {
        let mut rest = s as u64;
        let mut entry = 0u64;
        let mut stride = 1u64;
        for d in (0..table.dims).rev() {
            let coordinate = rest % self.padded_shape[d];
            rest /= self.padded_shape[d];
            if coordinate >= self.file_shape[d] {
                return (0.0, 0.0);
            }
            entry += coordinate * stride;
            stride *= self.file_shape[d];
        }
        table.pairs[entry as usize]
    }
}

/// A function reading one stored integer of `dtype` as f64 (exact for
/// every integer MINC2 stores; eight-byte ones round as numpy rounds them).
fn stored_reader(dtype: DType) -> fn(&[u8]) -> f64 {
    macro_rules! reader {
        ($t:ty, $n:expr) => {
            match dtype.endian {
                Endian::Little => |b: &[u8]| <$t>::from_le_bytes(array::<$n>(b)) as f64,
                Endian::Big => |b: &[u8]| <$t>::from_be_bytes(array::<$n>(b)) as f64,
            }
        };
    }
    match (dtype.kind, dtype.size) {
        (Kind::Unsigned, 1) => |b: &[u8]| b[0] as f64,
        (Kind::Signed, 1) => |b: &[u8]| b[0] as i8 as f64,
        (Kind::Unsigned, 2) => reader!(u16, 2),
        (Kind::Signed, 2) => reader!(i16, 2),
        (Kind::Unsigned, 4) => reader!(u32, 4),
        (Kind::Signed, 4) => reader!(i32, 4),
        (Kind::Unsigned, _) => reader!(u64, 8),
        _ => reader!(i64, 8),
    }
}

/// The first `N` bytes of `bytes` (callers slice exactly `N`).
fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[..N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dtype(kind: Kind, size: usize, endian: Endian) -> DType {
        DType::new(kind, size, endian).unwrap()
    }

    #[test]
    fn stored_integers_read_in_their_byte_order() {
        let i16be = stored_reader(dtype(Kind::Signed, 2, Endian::Big));
        assert_eq!(i16be(&(-300i16).to_be_bytes()), -300.0);
        let u32le = stored_reader(dtype(Kind::Unsigned, 4, Endian::Little));
        assert_eq!(u32le(&4_000_000_000u32.to_le_bytes()), 4e9);
        let i8 = stored_reader(dtype(Kind::Signed, 1, Endian::Little));
        assert_eq!(i8(&[0xff]), -1.0);
    }

    /// A 2×3 file of i16 in a 3×4 padded block, scaled per row: each
    /// value clipped, then `v * slope + inter`, into float32; the file's
    /// voxels land at their place in the padded block.
    #[test]
    fn values_are_clipped_scaled_and_placed_in_the_padded_block() {
        let stored = dtype(Kind::Signed, 2, Endian::Little);
        let decoder = ScaledMinc {
            file_shape: vec![2, 3],
            padded_shape: vec![3, 4],
            stored,
        };
        let table = ScaleTable {
            shape: vec![2, 3],
            dims: 1,
            pairs: vec![(0.5, 1.0), (2.0, -3.0)],
            valid: (-10.0, 10.0),
        };
        let voxels: [[i16; 3]; 2] = [[1, -20, 3], [4, 5, 30]];
        let mut block = vec![0u8; decoder.decoded_len() as usize];
        for (row, values) in voxels.iter().enumerate() {
            for (column, value) in values.iter().enumerate() {
                let at = (row * 4 + column) * 2;
                block[at..at + 2].copy_from_slice(&value.to_le_bytes());
            }
        }
        decoder.scale_in_place(&mut block, &table);
        let value = |row: usize, column: usize| {
            let at = (row * 4 + column) * 4;
            f32::from_ne_bytes(block[at..at + 4].try_into().unwrap())
        };
        assert_eq!(value(0, 0), 1.5);
        assert_eq!(value(0, 1), -4.0, "clipped to -10 first");
        assert_eq!(value(0, 2), 2.5);
        assert_eq!(value(1, 0), 5.0);
        assert_eq!(value(1, 1), 7.0);
        assert_eq!(value(1, 2), 17.0, "clipped to 10 first");
        assert_eq!(value(2, 0), 0.0, "a padding row scales to nothing");
    }

    #[test]
    fn one_pair_everywhere_is_global_and_the_unit_pair_over_the_range_is_identity() {
        let u8 = dtype(Kind::Unsigned, 1, Endian::Little);
        let table = |pairs: Vec<(f64, f64)>, valid| ScaleTable {
            shape: vec![2, 2],
            dims: 1,
            pairs,
            valid,
        };
        assert_eq!(
            table(vec![(1.0, 0.0); 2], (0.0, 255.0)).scaling(u8),
            ValueScaling::Identity
        );
        assert_eq!(
            table(vec![(1.0, 0.0); 2], (0.0, 100.0)).scaling(u8),
            ValueScaling::Global {
                slope: 1.0,
                inter: 0.0
            },
            "a narrower valid range clips"
        );
        assert_eq!(
            table(vec![(1.0, 0.0), (2.0, 0.0)], (0.0, 255.0)).scaling(u8),
            ValueScaling::PerSlice { entries: 2 }
        );
        assert_eq!(scaled_dtype(u8).numpy_descr(), "<f4");
        assert_eq!(
            scaled_dtype(dtype(Kind::Signed, 8, Endian::Big)).numpy_descr(),
            "<f8"
        );
    }
}
