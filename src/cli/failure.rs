//! What a failed `rechunk` run tells the user: what it left in OUT and what
//! to do, and [`Interrupted`], the error of a run a signal stopped.

use nix::sys::signal::Signal;

use crate::array::units::show_bytes;
use crate::cli::args::RechunkArgs;
use crate::error::Error;
use crate::input::InputArray;
use crate::sys::signals;

/// What a failed run left in OUT, and what to do about it (`with_no_space`
/// when the output's filesystem filled).
pub(super) struct Left {
    pub(super) what: String,
    pub(super) with_no_space: &'static str,
}

/// The error of a failed run that `left` what it says in OUT.
pub(super) fn explained_with(
    args: &RechunkArgs,
    left: &Left,
    free_at_start: Option<u64>,
    input: &InputArray,
    error: Error,
) -> anyhow::Error {
    let out = args.output.display();
    let what = &left.what;
    match error {
        Error::Cancelled => match signals::caught() {
            Some(signal) => Interrupted {
                signal,
                message: format!("interrupted by {signal} before {out} was complete: {what}"),
            }
            .into(),
            None => anyhow::anyhow!("cancelled: {what}"),
        },
        ref error if error.is_no_space() => {
            let free = free_at_start.map_or(String::new(), |free| {
                format!(", and {} were free when it started", show_bytes(free))
            });
            anyhow::anyhow!(
                "{out}: no space left on the output's filesystem: the array needs about {}{free}; \
                 {what}{}. ({error})",
                show_bytes(input.nbytes()),
                left.with_no_space
            )
        }
        other => anyhow::Error::from(other).context(format!("the run stopped: {what}")),
    }
}

/// A run stopped by a signal: the command's message, and the signal the
/// process then ends by (see [`signals::end_by`]).
#[derive(Debug)]
pub struct Interrupted {
    pub signal: Signal,
    pub message: String,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Interrupted {}
