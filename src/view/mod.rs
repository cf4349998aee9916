//! The view: an output served as files while a materialiser fills it in
//! the background. [`ViewCore`] is its filesystem as plain methods (what
//! FUSE and tests call), [`prepare`] checks a mount request and makes a
//! [`PreparedView`], which starts and stops its own materialiser
//! ([`PreparedView::start`]) and hands back the [`RunningView`]; the rest
//! (layout, staging, status, sweeps) are the parts these use.

mod core;
mod layout;
pub mod materialise;
mod node;
mod opens;
mod prepare;
mod requesters;
mod running;
mod space;
pub mod staging;
mod status;
mod sweep;

pub use self::core::{OnDemandCount, ViewCore};
pub use layout::{
    BlockTemplates, ViewLayout, ViewPyramid, METADATA_INO, METADATA_NAME, ROOT_INO, STATE_XATTR,
    STATUS_INO, STATUS_NAME, WAIT_INO, WAIT_NAME,
};
pub use materialise::Pacing;
pub use node::{Access, CacheMode, DirEntry, Errno, NodeAttr, NodeKind, ReadReply};
pub use opens::BlockOpen;
pub use prepare::{prepare, MountRequest, PreparedView};
pub use running::{RunningView, ViewStopper};
pub use status::Status;
