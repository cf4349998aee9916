//! Where an array's voxels are in the world: the voxel-to-world affine,
//! voxel sizes and value scaling that NIfTI outputs carry, learned from a
//! NIfTI or MINC2 input (identity for HDF5 and npy), and moved to each output
//! block so that voxel (0, 0, 0) of a block lands where that voxel lies in
//! the whole image.
//!
//! Affines here are in NIfTI's voxel order: column `a` of [`Space::affine`]
//! is the world step of NIfTI axis `a` (x = 0 is the fastest-moving axis,
//! which is the *last* internal C-order axis). The quaternion code follows
//! the NIfTI-1 reference implementation (`nifti_mat44_to_quatern` and
//! `nifti_quatern_to_mat44`), so nibabel and other readers see the same qform.

use serde::{Deserialize, Serialize};

/// NIfTI `xyzt_units` for millimetres (MINC2's world unit).
pub const UNITS_MM: u8 = 2;

/// Spatial metadata of a whole array, in NIfTI's voxel order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Space {
    /// Rows x, y, z of the voxel-to-world affine: world = affine · (i, j, k, 1)
    /// for NIfTI voxel indices of the whole array.
    pub affine: [[f64; 4]; 3],
    /// Voxel sizes per NIfTI axis (x, y, z, t, ...), one per array dimension
    /// (NIfTI's pixdim[1..]).
    pub zooms: Vec<f64>,
    /// NIfTI `xyzt_units` (0: unknown).
    pub xyzt_units: u8,
    /// NIfTI `scl_slope`, `scl_inter` turning stored values into real ones
    /// (`None`: the stored values are the values).
    pub scaling: Option<(f64, f64)>,
    /// Why NIfTI output cannot describe this input faithfully, if it cannot
    /// (per-slice MINC2 scaling, a MINC2 image whose last axes are not spatial).
    pub nifti_refusal: Option<String>,
}

impl Space {
    /// Voxel size 1 and origin 0 along every axis: what HDF5 and npy inputs,
    /// which carry no world coordinates, are given.
    pub fn identity(ndim: usize) -> Space {
        Space {
            affine: [
                [1.0, 0.0, 0.0, 0.0],
                [0.0, 1.0, 0.0, 0.0],
                [0.0, 0.0, 1.0, 0.0],
            ],
            zooms: vec![1.0; ndim],
            xyzt_units: 0,
            scaling: None,
            nifti_refusal: None,
        }
    }

    /// The affine of a block whose first voxel is at `origin` (internal C
    /// order) in the whole array: the same axes, translated to that voxel's
    /// world position.
    pub fn block_affine(&self, origin: &[u64]) -> [[f64; 4]; 3] {
        let ndim = origin.len();
        let mut affine = self.affine;
        for row in affine.iter_mut() {
            let mut shift = 0.0;
            for nifti_axis in 0..ndim.min(3) {
                let voxel = origin[ndim - 1 - nifti_axis] as f64;
                shift += row[nifti_axis] * voxel;
            }
            row[3] += shift;
        }
        affine
    }
}

/// A qform: rotation as a quaternion (b, c, d; a ≥ 0 implied), the sign of
/// the third axis, and the offset.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Qform {
    pub b: f64,
    pub c: f64,
    pub d: f64,
    pub qfac: f64,
    pub offset: [f64; 3],
}

/// How far from orthonormal a rotation may be (after float32 storage) and
/// still be written as a qform.
const ORTHONORMAL_TOLERANCE: f64 = 1e-4;

/// The qform matching `affine` with voxel sizes `zooms` (x, y, z), when the
/// affine is a rotation (possibly with a flip) times those sizes; `None` when
/// it shears or its column lengths disagree with the sizes, which a qform
/// cannot express.
pub fn qform_of(affine: &[[f64; 4]; 3], zooms: [f64; 3]) -> Option<Qform> {
    let mut r = [[0.0f64; 3]; 3];
    for (col, &zoom) in zooms.iter().enumerate() {
        let length = (0..3)
            .map(|row| affine[row][col].powi(2))
            .sum::<f64>()
            .sqrt();
        if zoom <= 0.0 || (length - zoom).abs() > ORTHONORMAL_TOLERANCE * zoom.max(1.0) {
            return None;
        }
        for row in 0..3 {
            r[row][col] = affine[row][col] / zoom;
        }
    }
    for i in 0..3 {
        for j in 0..3 {
            let dot: f64 = (0..3).map(|row| r[row][i] * r[row][j]).sum();
            let expected = if i == j { 1.0 } else { 0.0 };
            if (dot - expected).abs() > ORTHONORMAL_TOLERANCE {
                return None;
            }
        }
    }
    let det = r[0][0] * (r[1][1] * r[2][2] - r[1][2] * r[2][1])
        - r[0][1] * (r[1][0] * r[2][2] - r[1][2] * r[2][0])
        + r[0][2] * (r[1][0] * r[2][1] - r[1][1] * r[2][0]);
    let qfac = if det < 0.0 { -1.0 } else { 1.0 };
    if qfac < 0.0 {
        for row in &mut r {
            row[2] = -row[2];
        }
    }
    let (r11, r12, r13) = (r[0][0], r[0][1], r[0][2]);
    let (r21, r22, r23) = (r[1][0], r[1][1], r[1][2]);
    let (r31, r32, r33) = (r[2][0], r[2][1], r[2][2]);
    let trace = r11 + r22 + r33 + 1.0;
    let (mut a, mut b, mut c, mut d);
    if trace > 0.5 {
        a = 0.5 * trace.sqrt();
        b = 0.25 * (r32 - r23) / a;
        c = 0.25 * (r13 - r31) / a;
        d = 0.25 * (r21 - r12) / a;
    } else {
        let xd = 1.0 + r11 - (r22 + r33);
        let yd = 1.0 + r22 - (r11 + r33);
        let zd = 1.0 + r33 - (r11 + r22);
        if xd > 1.0 {
            b = 0.5 * xd.sqrt();
            c = 0.25 * (r12 + r21) / b;
            d = 0.25 * (r13 + r31) / b;
            a = 0.25 * (r32 - r23) / b;
        } else if yd > 1.0 {
            c = 0.5 * yd.sqrt();
            b = 0.25 * (r12 + r21) / c;
            d = 0.25 * (r23 + r32) / c;
            a = 0.25 * (r13 - r31) / c;
        } else {
            d = 0.5 * zd.sqrt();
            b = 0.25 * (r13 + r31) / d;
            c = 0.25 * (r23 + r32) / d;
            a = 0.25 * (r21 - r12) / d;
        }
        if a < 0.0 {
            b = -b;
            c = -c;
            d = -d;
            a = -a;
        }
    }
    // `a` is implied by b, c, d (a unit quaternion with a ≥ 0). An affine
    // read from 32-bit floats is not quite a rotation, which leaves the
    // quaternion off unit length; nibabel refuses b² + c² + d² > 1 beyond
    // rounding (in 64 bits, for NIfTI-2), as in a half turn, where a ≈ 0.
    let norm = (a * a + b * b + c * c + d * d).sqrt();
    let (b, c, d) = (b / norm, c / norm, d / norm);
    Some(Qform {
        b,
        c,
        d,
        qfac,
        offset: [affine[0][3], affine[1][3], affine[2][3]],
    })
}

/// The affine a qform describes, as nibabel computes it.
pub fn affine_of_qform(qform: &Qform, zooms: [f64; 3]) -> [[f64; 4]; 3] {
    let (mut b, mut c, mut d) = (qform.b, qform.c, qform.d);
    let mut a = 1.0 - (b * b + c * c + d * d);
    if a < 1e-7 {
        // A 180-degree rotation: renormalise (b, c, d), a = 0.
        let norm = (b * b + c * c + d * d).sqrt();
        if norm > 0.0 {
            b /= norm;
            c /= norm;
            d /= norm;
        }
        a = 0.0;
    } else {
        a = a.sqrt();
    }
    let r = [
        [
            a * a + b * b - c * c - d * d,
            2.0 * (b * c - a * d),
            2.0 * (b * d + a * c),
        ],
        [
            2.0 * (b * c + a * d),
            a * a + c * c - b * b - d * d,
            2.0 * (c * d - a * b),
        ],
        [
            2.0 * (b * d - a * c),
            2.0 * (c * d + a * b),
            a * a + d * d - c * c - b * b,
        ],
    ];
    let scale = [zooms[0], zooms[1], zooms[2] * qform.qfac];
    let mut affine = [[0.0; 4]; 3];
    for row in 0..3 {
        for col in 0..3 {
            affine[row][col] = r[row][col] * scale[col];
        }
        affine[row][3] = qform.offset[row];
    }
    affine
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[[f64; 4]; 3], b: &[[f64; 4]; 3]) -> bool {
        a.iter()
            .flatten()
            .zip(b.iter().flatten())
            .all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn block_affines_translate_by_the_block_origin() {
        let mut space = Space::identity(3);
        space.affine = [
            [-2.0, 0.0, 0.0, 10.0],
            [0.0, 3.0, 0.0, 20.0],
            [0.0, 0.0, 4.0, 30.0],
        ];
        // Internal origin (z, y, x) = (1, 2, 3): NIfTI voxel (3, 2, 1).
        let moved = space.block_affine(&[1, 2, 3]);
        assert_eq!(moved[0][3], 10.0 - 6.0);
        assert_eq!(moved[1][3], 20.0 + 6.0);
        assert_eq!(moved[2][3], 30.0 + 4.0);
        assert_eq!(moved[0][0], -2.0);
        // A 4-D array's first internal axis (t) moves nothing in space.
        assert_eq!(space.block_affine(&[5, 1, 2, 3]), moved);
        // 2-D: (y, x) only.
        let flat = space.block_affine(&[2, 3]);
        assert_eq!([flat[0][3], flat[1][3], flat[2][3]], [4.0, 26.0, 30.0]);
    }

    #[test]
    fn qforms_round_trip_rotations_and_flips() {
        let cases: [[[f64; 4]; 3]; 4] = [
            [
                [1.0, 0.0, 0.0, 1.0],
                [0.0, 1.0, 0.0, 2.0],
                [0.0, 0.0, 1.0, 3.0],
            ],
            [
                [-0.5, 0.0, 0.0, 1.0],
                [0.0, 0.5, 0.0, 2.0],
                [0.0, 0.0, 2.0, 3.0],
            ],
            // MINC zspace,yspace,xspace in NIfTI order with a flipped z.
            [
                [0.0, 0.0, 1.0, -5.0],
                [0.0, 1.0, 0.0, 2.0],
                [-1.0, 0.0, 0.0, 3.0],
            ],
            // A rotation about z by 30 degrees, zooms 2, 3, 4.
            [
                [2.0 * 0.866_025_403_784_438_6, -3.0 * 0.5, 0.0, 0.0],
                [2.0 * 0.5, 3.0 * 0.866_025_403_784_438_6, 0.0, 0.0],
                [0.0, 0.0, 4.0, 0.0],
            ],
        ];
        for affine in cases {
            let zooms = [0, 1, 2].map(|col| {
                (0..3)
                    .map(|row| affine[row][col] * affine[row][col])
                    .sum::<f64>()
                    .sqrt()
            });
            let qform = qform_of(&affine, zooms).expect("representable");
            assert!(
                close(&affine_of_qform(&qform, zooms), &affine),
                "{affine:?}"
            );
        }
        let sheared = [
            [1.0, 0.5, 0.0, 0.0],
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 1.0, 0.0],
        ];
        assert_eq!(qform_of(&sheared, [1.0, 1.118_033_988_749_895, 1.0]), None);
        let identity = Space::identity(3).affine;
        assert_eq!(qform_of(&identity, [2.0, 1.0, 1.0]), None);
    }
}
