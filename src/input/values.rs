//! Which values of an input a run writes (`--values`): the stored ones, or
//! a MINC2 integer image's physical values. Scaled MINC2 blocks become
//! encoded input ([`Storage::Encoded`]): each file read whole and decoded
//! into float32, so the planner counts one read per block and the decoded
//! block in its peak memory, as for any encoded input.
//!
//! Without `--values` the stored values are written wherever that loses
//! nothing a reader needs: the input has no scaling, or the output records
//! it (NIfTI's `scl_slope`/`scl_inter`, for one global scaling). Elsewhere,
//! HDF5 output included (its dataset would hold numbers that are not the
//! image's values, with nothing saying so), the run is refused, and the
//! message names both choices.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use super::array::InputArray;
use crate::array::geometry::FileShape;
use crate::error::{Error, Result};
use crate::format::decode::BlockDecode;
use crate::format::minc::{self, ValueScaling};
use crate::format::{BlockFormat, Storage};

/// The values a run writes (`--values`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Values {
    /// The stored values, moved as they are.
    Stored,
    /// A MINC2 integer image's physical values, as nibabel's `get_fdata`
    /// computes them, as float32.
    Scaled,
}

impl FromStr for Values {
    type Err = Error;

    fn from_str(text: &str) -> Result<Values> {
        match text.trim().to_ascii_lowercase().as_str() {
            "stored" => Ok(Values::Stored),
            "scaled" => Ok(Values::Scaled),
            _ => Err(Error::BadArgument(format!(
                "--values '{text}': use stored (the stored values, moved as they are) or scaled \
                 (a MINC2 image's physical values, as float32)"
            ))),
        }
    }
}

impl InputArray {
    /// The input as `values` asks (`None`: not said) for output `format`:
    /// itself, or for [`Values::Scaled`] a MINC2 integer image as encoded
    /// blocks of its physical values. Refuses `--values scaled` for inputs
    /// with nothing to scale, and an unsaid choice where the stored values
    /// would lose the input's scaling (see the module's notes).
    pub fn with_values(self, values: Option<Values>, format: BlockFormat) -> Result<InputArray> {
        if !self.format.traits().stored_scaling {
            return match values {
                Some(Values::Scaled) => Err(Error::BadArgument(format!(
                    "--values scaled applies to MINC2 images, whose image-min/image-max scale \
                     their stored values; {} is {}, whose values are moved as stored",
                    self.source.display(),
                    self.format.name()
                ))),
                _ => Ok(self),
            };
        }
        let (scaling, decided_by) = self.scaling()?;
        let decided_by = decided_by.to_path_buf();
        match values {
            Some(Values::Stored) => Ok(self),
            Some(Values::Scaled) => self.scaled(&scaling, &decided_by),
            None if stored_keeps(&scaling, format) => Ok(self),
            None => Err(Error::BadArgument(unsaid_refusal(
                &decided_by,
                &scaling,
                format,
            ))),
        }
    }

    /// The scaling of every block: one, if all share it; per slice if any
    /// varies, or if the blocks' scalings differ; absent if any block has
    /// none. With it, the block that decided it.
    fn scaling(&self) -> Result<(ValueScaling, &Path)> {
        let mut common: Option<ValueScaling> = None;
        for block in &self.blocks {
            let scaling = minc::value_scaling(&block.path, self.dtype)?;
            let decided = match (common, scaling) {
                (_, ValueScaling::Absent) => ValueScaling::Absent,
                (None, scaling) => scaling,
                (Some(seen), scaling) if seen == scaling => seen,
                (Some(ValueScaling::PerSlice { entries }), _) => ValueScaling::PerSlice { entries },
                (_, _) => ValueScaling::PerSlice {
                    entries: self.blocks.len(),
                },
            };
            if matches!(
                decided,
                ValueScaling::Absent | ValueScaling::PerSlice { .. }
            ) {
                return Ok((decided, &block.path));
            }
            common = Some(decided);
        }
        Ok((common.unwrap_or(ValueScaling::Absent), &self.source))
    }

    /// This MINC2 input's blocks as encoded blocks of physical values
    /// (float images, already physical, stay as they are).
    fn scaled(mut self, scaling: &ValueScaling, decided_by: &Path) -> Result<InputArray> {
        match scaling {
            ValueScaling::Float => return Ok(self),
            ValueScaling::Absent => {
                return Err(Error::BadArgument(format!(
                    "--values scaled: {} has no image-min/image-max, so its physical values \
                     are not known; pass --values stored to write its stored values",
                    decided_by.display()
                )))
            }
            _ => {}
        }
        let grid = self.grid();
        let mut decoders: BTreeMap<Vec<u64>, Arc<dyn BlockDecode>> = BTreeMap::new();
        for (rank, block) in self.blocks.iter_mut().enumerate() {
            let file_shape = grid.block(&grid.unravel(rank as u64)).shape;
            let len = std::fs::metadata(&block.path)
                .map_err(|e| Error::io(&block.path, "stat", e))?
                .len();
            let decoder = decoders
                .entry(file_shape.clone())
                .or_insert_with(|| {
                    minc::scaled_decoder(file_shape, self.block_shape.clone(), self.dtype)
                })
                .clone();
            block.storage = Storage::Encoded {
                decoder,
                offset: 0,
                len,
            };
            block.check = None;
        }
        self.dtype = minc::scaled_dtype(self.dtype);
        self.files = FileShape::Encoded {
            padded_to: Some(self.block_shape.clone()),
        };
        Ok(self)
    }
}

/// Whether writing the stored values as `format` keeps what `scaling`
/// says of them (see the module's notes).
fn stored_keeps(scaling: &ValueScaling, format: BlockFormat) -> bool {
    match scaling {
        ValueScaling::Float | ValueScaling::Absent | ValueScaling::Identity => true,
        ValueScaling::Global { .. } => format.traits().global_scaling,
        ValueScaling::PerSlice { .. } => false,
    }
}

/// Why the stored values of `input` cannot be written as `format`
/// unless `--values` says so, and what to pass.
fn unsaid_refusal(path: &Path, scaling: &ValueScaling, format: BlockFormat) -> String {
    let how = match scaling {
        ValueScaling::PerSlice { entries } => {
            format!("a scaling that varies per slice ({entries} image-min/image-max ranges)")
        }
        ValueScaling::Global { slope, inter } => {
            format!("one scaling for the whole image (slope {slope}, intercept {inter})")
        }
        _ => "a scaling".into(),
    };
    let choices = if format.traits().global_scaling {
        "pass --values scaled to write the physical values as float32 (as nibabel's get_fdata \
         computes them), or --values stored with --format h5 to write the stored values \
         without their scaling"
    } else {
        "pass --values scaled to write the physical values as float32 (as nibabel's get_fdata \
         computes them), or --values stored to write the stored values without their scaling"
    };
    format!(
        "{}: its stored values become its physical values through {how}, which {} output \
         cannot record; {choices}",
        path.display(),
        format.name()
    )
}
