//! `serve`: a read-only HTTP server for a mounted view or an output
//! directory, and what `serve` and `mount --serve` print about it: where
//! it listens, what to give Neuroglancer, and who else can read it.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use crate::cli::ServeArgs;
use crate::http::{self, Cors, DirTree, HttpServer, Service, Tree};

pub(super) fn serve_command(args: ServeArgs) -> anyhow::Result<()> {
    let tree = Arc::new(DirTree::new(&args.path)?);
    let listener = listen(&args.bind)?;
    let server = server_of(listener, args.cors_origin.as_deref(), tree)?;
    let what = format!("{}", args.path.display());
    eprint!("{}", announcement(&server, &what, is_private(&args.path))?);
    server.run()?;
    Ok(())
}

/// A socket listening on `bind` (`PORT` or `HOST:PORT`).
pub(super) fn listen(bind: &str) -> anyhow::Result<TcpListener> {
    Ok(http::bind(http::parse_bind(bind)?)?)
}

/// A server of `tree` on `listener`, not yet started, with CORS from
/// `cors_origin` or the default for where it listens.
pub(super) fn server_of(
    listener: TcpListener,
    cors_origin: Option<&str>,
    tree: Arc<dyn Tree>,
) -> anyhow::Result<HttpServer> {
    let address = listener.local_addr().context("the server's address")?;
    let cors = http::cors_for(address, cors_origin);
    let service = Service::new(tree, cors, http::hosts_for(address));
    Ok(HttpServer::new(listener, service))
}

/// What to print about a server of `what`: its URL, what to give
/// Neuroglancer, and what is open to whom (`private`: other users of this
/// machine may not read it, yet can connect); one line each.
pub(super) fn announcement(
    server: &HttpServer,
    what: &str,
    private: bool,
) -> anyhow::Result<String> {
    let address = server.address()?;
    let url = http::root_url(address);
    let mut lines = vec![format!("serving {what} read-only at {url}")];
    lines.push(match http::viewer_source(server.service().tree(), &url) {
        Some(source) => format!("in Neuroglancer, open the source {source}"),
        None => format!("in a browser or any HTTP reader: {url}FILE"),
    });
    if !address.ip().is_loopback() {
        lines.push(format!(
            "warning: listening on {address}, not on loopback: anyone who can reach this \
             machine on port {} can read every file served",
            address.port()
        ));
    }
    if private {
        lines.push(format!(
            "warning: {what} is not open to other users, but every user of this machine can \
             connect to port {} and read it",
            address.port()
        ));
    }
    if server.service().cors() == &Cors::Off {
        lines.push(
            "note: no CORS headers: web viewers served from other sites cannot read it \
             (--cors-origin ORIGIN, or '*', allows them)"
                .to_string(),
        );
    }
    Ok(lines.iter().map(|line| format!("{line}\n")).collect())
}

/// Whether other users of this machine may not read `path`.
fn is_private(path: &Path) -> bool {
    let mode = std::fs::metadata(path).map(|m| m.permissions().mode());
    mode.is_ok_and(|mode| mode & 0o005 != 0o005)
}
