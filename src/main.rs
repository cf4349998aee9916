//! The `rechunkfs` command: parse arguments, run, and turn any error into a
//! message on stderr and a non-zero exit code.

use clap::Parser;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = rechunkfs::cli::Cli::parse();
    if let Err(error) = rechunkfs::cli::run(cli) {
        eprintln!("rechunkfs: error: {error:#}");
        std::process::exit(1);
    }
}
