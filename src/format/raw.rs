//! Raw blocks (`.raw`): data only, no header; written only, with
//! rechunkfs's metadata file describing them.

use super::traits::{data_only_template, FormatTraits};

/// Raw's row of the format table.
pub(super) const TRAITS: FormatTraits = FormatTraits {
    name: "raw",
    extension: "raw",
    input_extensions: &["raw"],
    probe: Err(
        "raw blocks hold data only, with no header saying their shape and dtype, so rechunkfs \
         cannot read them as input; convert them to .npy first",
    ),
    template: Ok(data_only_template),
    data_only: true,
    ..FormatTraits::NONE
};
