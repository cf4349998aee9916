//! The command line: which command runs; the arguments of every command
//! are in `args`. Each command has its own file and is a thin layer over
//! the library; messages say what is wrong and what to do.

mod args;
mod failure;
mod finish;
mod levels;
mod mount;
mod plan;
mod pyramid;
mod rechunk;
mod report;
mod request;
pub mod sample;
mod serve;
mod slurm;
mod status;
mod test_hooks;

use std::path::PathBuf;

pub use args::{
    Cli, Command, FinishArgs, InputArgs, MountArgs, PlanArgs, PlanningArgs, PyramidArgs,
    RechunkArgs, SampleArgs, ServeArgs, SlurmArgs, StatusArgs, UmountArgs, FORMAT_HELP,
};
pub use failure::Interrupted;

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Plan(mut args) => {
            args.planning.set_threads();
            if let Some(input) = &args.input {
                args.input = Some(chosen_array(input, &args.input_args)?);
            }
            plan::plan_command(args)
        }
        Command::Rechunk(mut args) => {
            args.planning.set_threads();
            args.input = chosen_array(&args.input, &args.input_args)?;
            rechunk::rechunk_command(args)
        }
        Command::Mount(mut args) => {
            args.planning.set_threads();
            args.input = chosen_array(&args.input, &args.input_args)?;
            mount::mount_command(args)
        }
        Command::Umount(args) => status::umount_command(args),
        Command::Status(args) => status::status_command(args),
        Command::Finish(args) => finish::finish_command(args),
        Command::Slurm(mut args) => {
            args.input = chosen_array(&args.input, &args.input_args)?;
            slurm::slurm_command(args)
        }
        Command::Sample(args) => sample::sample_command(args),
        Command::Serve(args) => serve::serve_command(args),
    }
}

/// The input to read: IN, or with `--array` the array it names inside the
/// Zarr group IN.
fn chosen_array(input: &std::path::Path, args: &InputArgs) -> anyhow::Result<PathBuf> {
    Ok(match &args.array {
        Some(array) => crate::format::zarr::array_in_group(input, array)?,
        None => input.to_path_buf(),
    })
}
