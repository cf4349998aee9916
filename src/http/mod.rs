//! A read-only HTTP server for a view or an output directory, so that
//! browser viewers (Neuroglancer) and HTTP readers (TensorStore, zarr-python
//! with fsspec) read the blocks without a mount.
//!
//! The request-to-response logic ([`respond`]: which file, which bytes,
//! which status and headers) knows nothing of sockets and is tested
//! directly; [`server`] is the thin socket layer over hyper, with the
//! limits and timeouts that keep hostile clients from starving the rest.
//! What is served is a [`tree::Tree`]:
//! a directory (a mounted view's too, through the filesystem), or a view's
//! core, whose reads of pending blocks wait exactly as through FUSE.

pub mod range;
pub mod respond;
pub mod server;
pub mod target;
pub mod tree;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};

pub use respond::{Cors, Hosts, Service};
pub use server::HttpServer;
pub use tree::{DirTree, Tree, ViewTree};

use crate::error::{Error, Result};

/// Where `serve` listens unless told otherwise.
pub const DEFAULT_BIND: &str = "127.0.0.1:8000";

/// The address `text` names: `PORT` (on 127.0.0.1), `HOST:PORT` or
/// `[V6]:PORT`.
pub fn parse_bind(text: &str) -> Result<SocketAddr> {
    let bad = |why: String| {
        Error::BadArgument(format!(
            "bind address {text:?}: {why} (give PORT, or HOST:PORT such as 127.0.0.1:8000)"
        ))
    };
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    let mut found = text.to_socket_addrs().map_err(|e| bad(e.to_string()))?;
    found
        .next()
        .ok_or_else(|| bad("it names no address".into()))
}

/// A socket listening on `address`.
pub fn bind(address: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(address).map_err(|e| {
        Error::BadArgument(format!(
            "cannot listen on {address}: {e} (choose another port, or 0 for any free one)"
        ))
    })
}

/// Which origins may read, by default: any web page when only this
/// machine can connect; when the socket is open to the network, none but
/// the ones given (`--cors-origin`), so that opening it is one choice and
/// letting every web page read it is another.
pub fn cors_for(address: SocketAddr, given: Option<&str>) -> Cors {
    match given {
        Some("*") => Cors::Any,
        Some("none") => Cors::Off,
        Some(origin) => Cors::Origin(origin.trim_end_matches('/').to_string()),
        None if address.ip().is_loopback() => Cors::Any,
        None => Cors::Off,
    }
}

/// Which `Host` headers to answer on `address`: loopback names only when
/// only this machine can connect.
pub fn hosts_for(address: SocketAddr) -> Hosts {
    if address.ip().is_loopback() {
        Hosts::Loopback
    } else {
        Hosts::Any
    }
}

/// The server's root URL for a client on this machine.
pub fn root_url(address: SocketAddr) -> String {
    let host = if address.ip().is_unspecified() || address.ip().is_loopback() {
        match address {
            SocketAddr::V4(_) => "127.0.0.1".to_string(),
            SocketAddr::V6(_) => "[::1]".to_string(),
        }
    } else {
        match address {
            SocketAddr::V4(v4) => v4.ip().to_string(),
            SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
        }
    };
    format!("http://{host}:{}/", address.port())
}

/// The data source to give Neuroglancer for the tree served at `url`:
/// `zarr://…` for a Zarr array, `precomputed://…` for a precomputed
/// volume; `None` when the root is neither.
pub fn viewer_source(tree: &dyn Tree, url: &str) -> Option<String> {
    let has = |name: &str| tree::has_file(tree, &[name]);
    if has(".zarray") || has("zarr.json") || has(".zattrs") {
        Some(format!("zarr://{url}"))
    } else if has("info") {
        Some(format!("precomputed://{url}"))
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
