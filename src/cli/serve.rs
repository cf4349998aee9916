//! `serve`: a read-only HTTP server for a mounted view or an output
//! directory, and what `serve` and `mount --serve` print about it: where
//! it listens, what to give Neuroglancer, and who else can read it.
//!
//! Beside the source URL goes a whole Neuroglancer state, as a link: the
//! layer, the global dimensions with their units (from the OME-Zarr axes,
//! the precomputed `info`, or the Zarr array's own names), displayed in
//! the viewer's x, y, z order, and the shader's range from the OME-Zarr
//! `omero` window (or the precomputed `info`'s `rechunkfs.window`), so
//! that the picture opens with its own contrast.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use serde_json::{json, Value};

use crate::array::units::si_unit;
use crate::cli::args::ServeArgs;
use crate::http::{self, Cors, DirTree, HttpServer, Service, Tree};

/// The Neuroglancer client that state links open in.
const NEUROGLANCER: &str = "https://neuroglancer-demo.appspot.com/";
/// Metadata files larger than this are not read for the state link.
const MAX_METADATA: u64 = 1 << 20;

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
    let tree = server.service().tree();
    match http::viewer_source(tree, &url) {
        Some(source) => {
            let state = neuroglancer_state(tree, &source);
            lines.push(format!("in Neuroglancer, open the source {source}"));
            lines.push(format!("or the whole view: {}", state_link(&state)));
            if state["layers"][0]["shaderControls"].is_null() {
                lines.push(
                    "(no contrast range in that link: one comes from level 0's values once a                      pyramid's level 1 is complete, with --levels; for a view still filling, run                      `rechunkfs serve VIEW` again then)"
                        .into(),
                );
            }
        }
        None => lines.push(format!("in a browser or any HTTP reader: {url}FILE")),
    }
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

/// A Neuroglancer state showing `source`, whose metadata `tree` holds.
pub(super) fn neuroglancer_state(tree: &dyn Tree, source: &str) -> Value {
    let read = |name: &str| -> Option<Value> {
        let mut file = tree.open(&[name.to_string()]).ok()?;
        let size = file.size();
        if size > MAX_METADATA {
            return None;
        }
        serde_json::from_slice(&file.read_at(0, size as usize).ok()?).ok()
    };
    let zarr3 = read("zarr.json");
    let ome = read(".zattrs")
        .or_else(|| zarr3.as_ref().map(|z| z["attributes"]["ome"].clone()))
        .filter(|ome| ome["multiscales"].is_array());
    let info = read("info");
    // Each dimension, C order: its name, voxel size and unit.
    let mut dims: Vec<(String, f64, String)> = Vec::new();
    let mut window = None;
    let mut layer = "image";
    if let Some(ome) = &ome {
        let multiscale = &ome["multiscales"][0];
        let scale = &multiscale["datasets"][0]["coordinateTransformations"][0]["scale"];
        for (d, axis) in multiscale["axes"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let name = axis["name"].as_str().unwrap_or("d").to_string();
            if axis["type"] == "channel" {
                continue;
            }
            let voxel = scale[d].as_f64().unwrap_or(1.0);
            let (factor, unit) = axis["unit"].as_str().and_then(si_unit).unwrap_or((1.0, ""));
            dims.push((name, voxel * factor, unit.to_string()));
        }
        let channel = &ome["omero"]["channels"][0]["window"];
        window = channel["start"].as_f64().zip(channel["end"].as_f64());
    } else if let Some(info) = &info {
        let resolution = &info["scales"][0]["resolution"];
        for (d, name) in ["x", "y", "z"].iter().enumerate().rev() {
            let nm = resolution[d].as_f64().unwrap_or(1.0);
            dims.push((name.to_string(), nm * 1e-9, "m".to_string()));
        }
        if info["type"] == "segmentation" {
            layer = "segmentation";
        }
        let range = &info["rechunkfs"]["window"];
        window = range[0].as_f64().zip(range[1].as_f64());
    } else {
        let array = read(".zarray").or(zarr3);
        let ndim = array
            .as_ref()
            .and_then(|a| a["shape"].as_array())
            .map_or(0, Vec::len);
        let names = array.as_ref().and_then(|a| a["dimension_names"].as_array());
        for d in 0..ndim {
            let named = names.and_then(|n| n.get(d)).and_then(Value::as_str);
            let name = named.map_or_else(|| format!("d{d}"), str::to_string);
            dims.push((name, 1.0, String::new()));
        }
    }
    // The viewer's x, y, z are the array's fastest three axes, fastest
    // first; the others (time) follow.
    let spatial = dims.len().min(3);
    let ordered = dims
        .iter()
        .rev()
        .take(spatial)
        .chain(&dims[..dims.len() - spatial]);
    let dimensions: serde_json::Map<String, Value> = ordered
        .map(|(name, size, unit)| (name.clone(), json!([size, unit])))
        .collect();
    let display: Vec<&str> = dims.iter().rev().take(3).map(|d| d.0.as_str()).collect();
    let mut layer = json!({ "type": layer, "name": "rechunkfs", "source": source });
    if let Some((start, end)) = window.filter(|(start, end)| start < end) {
        layer["shaderControls"] = json!({ "normalized": { "range": [start, end] } });
    }
    let mut state = json!({ "layers": [layer], "layout": "4panel" });
    if !dims.is_empty() {
        state["dimensions"] = Value::Object(dimensions);
        state["displayDimensions"] = json!(display);
    }
    state
}

/// A link opening `state` in Neuroglancer: the state as the URL's fragment.
pub(super) fn state_link(state: &Value) -> String {
    let mut link = format!("{NEUROGLANCER}#!");
    for byte in state.to_string().bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~:,/[]".contains(&byte) {
            link.push(byte as char);
        } else {
            link.push_str(&format!("%{byte:02X}"));
        }
    }
    link
}
