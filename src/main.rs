//! The `rechunkfs` command: parse arguments, run, and turn any error into a
//! message on stderr and a non-zero exit code.

use clap::Parser;

fn main() {
    let cli = rechunkfs::cli::Cli::parse();
    // A view's daemon logs what it does (to its log file); commands say
    // only what goes wrong.
    let level = match cli.command {
        // fuser warns when its own unmount finds the view already detached.
        rechunkfs::cli::Command::Mount(_) => "info,fuser::session=error",
        _ => "warn",
    };
    // Milliseconds: a view's daemon log is read to see where a 0.2 s run went.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_timestamp_millis()
        .init();
    rechunkfs::sys::limits::map_large_buffers_separately();
    rechunkfs::sys::limits::raise_open_file_limit();
    rechunkfs::sys::limits::reserve_descriptor_table();
    // A server must outlive a client that goes away mid-response.
    let serves = matches!(
        cli.command,
        rechunkfs::cli::Command::Mount(_) | rechunkfs::cli::Command::Serve(_)
    );
    if !serves {
        // Like other Unix tools, end quietly when a reader of our output
        // goes away (`rechunkfs status VIEW | head`) instead of panicking.
        // SAFETY: setting a signal's disposition to its default.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    if let Err(error) = rechunkfs::cli::run(cli) {
        eprintln!("rechunkfs: error: {}", message_of(&error));
        if let Some(interrupted) = error.downcast_ref::<rechunkfs::cli::Interrupted>() {
            rechunkfs::sys::signals::end_by(interrupted.signal);
        }
        std::process::exit(1);
    }
}

/// The error and its causes, each once: the library's messages already end
/// with their cause (so they read whole in a log), and a context such as
/// `--shape` does not.
fn message_of(error: &anyhow::Error) -> String {
    let mut message = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !message.ends_with(&cause) {
            message.push_str(": ");
            message.push_str(&cause);
        }
    }
    message
}
