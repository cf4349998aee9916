//! The user-facing axis order: the one place that maps between the order in
//! which people write shapes and block indices and rechunkfs's internal C
//! order.
//!
//! Internally every array is in C order (the last axis moves fastest in the
//! file), because that is how the bytes lie and rechunking moves bytes,
//! never transposes. People, though, read shapes from their format's usual
//! reader: h5py and numpy report C order, and so does nibabel for MINC2 (a
//! MINC image's shape follows its `dimorder`, e.g. `zspace,yspace,xspace`);
//! nibabel reports NIfTI shapes as (x, y, z, ...), x fastest, which is C
//! order reversed.
//!
//! The rule: **the input's format decides the order for the whole run**.
//! `--shape`, the indices in input and output block file names
//! (`{i}_{j}_{k}`), and every shape printed (plan, reports, `rechunkfs.json`)
//! are in that order, whatever the output format. So a NIfTI input is
//! addressed as (x, y, z) in and out, even when its blocks are written as
//! HDF5; an HDF5, npy or MINC2 input is addressed in C order, even when its
//! blocks are written as NIfTI (whose headers then list the same sides
//! reversed, as NIfTI always does).

use serde::{Deserialize, Serialize};

/// The order of user-facing shapes and indices, relative to C order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AxisOrder {
    /// As stored: the last number is the fastest-moving axis (numpy, h5py, MINC2).
    #[default]
    C,
    /// NIfTI's (x, y, z, ...): the first number is the fastest-moving axis (nibabel).
    Nifti,
}

/// What `--help` and the README say about axis order, as a literal so that
/// `concat!` can put it after other help text.
macro_rules! axis_order_help {
    () => {
        "Axis order: the input's format decides it for the whole run, in and out. For HDF5, \
npy, MINC2, Zarr and TIFF input, shapes (--shape, plan and report output, rechunkfs.json) and \
block indices ({i}_{j}_{k}) are in C order, as h5py, numpy, nibabel's MINC2 reader, zarr-python \
and tifffile ((Z, Y, X) for a stack of slices) report them: \
the last number is the fastest-moving axis in the file. For NIfTI input they are in NIfTI's \
(x, y, z) order, as nibabel reports them: the first number is the fastest-moving axis. Output \
blocks are named in the same order whatever their format; bytes are moved, never transposed."
    };
}
pub(crate) use axis_order_help;

/// The axis-order rule in words, as `--help` prints it.
pub const AXIS_ORDER_HELP: &str = axis_order_help!();

impl AxisOrder {
    /// Internal C order to the user's order (shapes, indices, origins).
    pub fn to_user<T: Clone>(self, internal: &[T]) -> Vec<T> {
        self.permute(internal)
    }

    /// The user's order to internal C order.
    pub fn to_internal<T: Clone>(self, user: &[T]) -> Vec<T> {
        // Reversal is its own inverse.
        self.permute(user)
    }

    /// The user's number for internal axis `axis` of an `ndim`-dimensional array.
    pub fn user_axis(self, axis: usize, ndim: usize) -> usize {
        match self {
            AxisOrder::C => axis,
            AxisOrder::Nifti => ndim - 1 - axis,
        }
    }

    /// How numpy reshapes a block's bytes to its user-order shape:
    /// `numpy.fromfile(...).reshape(shape, order=...)`.
    pub fn numpy_order(self) -> &'static str {
        match self {
            AxisOrder::C => "C",
            AxisOrder::Nifti => "F",
        }
    }

    /// A sentence for metadata files and messages.
    pub fn describe(self) -> &'static str {
        match self {
            AxisOrder::C => {
                "C order (numpy, h5py, MINC2): the last index moves fastest in the file; block \
                 (i, j, k) starts at (i, j, k) * block_shape, and edge blocks are smaller"
            }
            AxisOrder::Nifti => {
                "NIfTI order (x, y, z, as nibabel reports it): the first index moves fastest in \
                 the file; block (i, j, k) starts at (i, j, k) * block_shape, and edge blocks \
                 are smaller"
            }
        }
    }

    fn permute<T: Clone>(self, values: &[T]) -> Vec<T> {
        match self {
            AxisOrder::C => values.to_vec(),
            AxisOrder::Nifti => values.iter().rev().cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_round_trip() {
        let internal = [7u64, 5, 3];
        assert_eq!(AxisOrder::C.to_user(&internal), internal);
        assert_eq!(AxisOrder::Nifti.to_user(&internal), [3, 5, 7]);
        for order in [AxisOrder::C, AxisOrder::Nifti] {
            assert_eq!(order.to_internal(&order.to_user(&internal)), internal);
        }
        assert_eq!(AxisOrder::Nifti.user_axis(0, 3), 2);
        assert_eq!(AxisOrder::C.user_axis(0, 3), 0);
    }
}
