//! `finish`: the end of a job run in parts. Every block is checked to be
//! in OUT, complete, before the files describing the whole array (Zarr
//! metadata, `rechunkfs.json`) are written, last: until then no reader
//! takes OUT for a complete array.

use crate::cli::args::FinishArgs;
use crate::output::job;

pub(super) fn finish_command(args: FinishArgs) -> anyhow::Result<()> {
    let finished = job::finish(&args.output)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&finished)?);
        return Ok(());
    }
    let wrote = if finished.metadata_files.is_empty() {
        "(its blocks carry their own headers: no other file is needed)".to_string()
    } else {
        format!("wrote {}", finished.metadata_files.join(", "))
    };
    println!(
        "{}: all {} blocks are complete; {wrote}",
        args.output.display(),
        finished.blocks
    );
    Ok(())
}
