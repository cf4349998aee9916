//! `mount`: checks what can be checked in the calling process, prepares
//! the view, then serves it here (foreground, with a progress bar) or from
//! a daemon forked once the view is prepared.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::array::geometry::show_shape;
use crate::cli::args::{format_note, MountArgs};
use crate::cli::report::{progress_bar, thousands};
use crate::cli::request::request_of;
use crate::cli::serve::{announcement, listen, server_of};
use crate::cli::test_hooks;
use crate::format::BlockFormat;
use crate::fuse::session;
use crate::http::ViewTree;
use crate::output::request::Request;
use crate::view::{MountRequest, PreparedView, ViewCore, ROOT_INO};

pub(super) fn mount_command(args: MountArgs) -> anyhow::Result<()> {
    session::check_mount_point(&args.view)?;
    session::check_fuse()?;
    // Listening before the view is prepared: a port in use is refused
    // with nothing made.
    let listener = args.serve.as_deref().map(listen).transpose()?;
    let request = mount_request_of(&args)?;
    let prepared = crate::view::prepare(&request)?;
    let summary = summary(&prepared, request.request.format);
    let mut extras = session::Extras {
        pacing: test_hooks::pacing(),
        beside: Vec::new(),
    };
    let mut serving = String::new();
    if let Some(listener) = listener {
        let tree = Arc::new(ViewTree::new(prepared.core.clone()));
        let server = server_of(listener, args.cors_origin.as_deref(), tree)?;
        let root = prepared.core.getattr(ROOT_INO);
        let private = root.is_ok_and(|root| root.perm & 0o005 != 0o005);
        serving = announcement(&server, "the view", private)?;
        extras.beside.push(Box::new(move || server.start()));
    }
    if args.foreground {
        let core = prepared.core.clone();
        let view = args.view.clone();
        session::serve(prepared, extras, move |ready| match ready {
            Ok(()) => {
                eprintln!("mounted {}: {summary}; Ctrl-C unmounts", view.display());
                eprint!("{serving}");
                spawn_progress(core);
            }
            Err(e) => eprintln!("rechunkfs: error: {e}"),
        })?;
        eprintln!("unmounted {}", args.view.display());
    } else {
        let log = session::log_path(&prepared);
        let pid = session::serve_in_background(prepared, extras)?;
        eprintln!(
            "mounted {}: {summary}; daemon pid {pid}, log {}",
            args.view.display(),
            log.display()
        );
        eprint!("{serving}");
    }
    Ok(())
}

fn mount_request_of(args: &MountArgs) -> anyhow::Result<MountRequest> {
    if let Some(codec) = &args.planning.compress {
        anyhow::bail!(
            "--compress {codec}: a view's sizes must be exact before the data exist, and a \
             compressed block's size is known only once it is written; compress with \
             `rechunkfs rechunk` instead"
        );
    }

    // The daemon outlives this command; absolute paths keep status and
    // logs unambiguous.
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let asked = request_of(
        &args.input,
        args.format.as_deref(),
        &args.planning,
        &args.input_args,
        &args.pyramid,
    )?;
    Ok(MountRequest {
        request: Request {
            input: absolute(&args.input),
            ..asked
        },
        view: absolute(&args.view),
        staging: args.staging.as_deref().map(absolute),
        rebuild: args.rebuild,
        allow_other: args.allow_other,
        in_order: args.in_order,
    })
}

/// "24 blocks of 10×10×10 (0 done already), staging in DIR".
fn summary(prepared: &PreparedView, asked: Option<BlockFormat>) -> String {
    let status = prepared.core.status();
    let layout = prepared.core.layout();
    let asked = asked.unwrap_or_else(|| prepared.input.format.default_output());
    let note = format_note(asked, layout.format).map_or(String::new(), |note| format!(" ({note})"));
    format!(
        "{} blocks of {}{note} ({} done already), staging in {}",
        thousands(status.blocks_total),
        show_shape(&layout.axis_order.to_user(&layout.output_block)),
        thousands(status.blocks_done),
        status.staging.display()
    )
}

/// A progress bar for a foreground mount, until every block is done.
fn spawn_progress(core: Arc<ViewCore>) {
    let status = core.status();
    let bar = progress_bar(status.bytes_total, false);
    let _ = std::thread::Builder::new()
        .name("progress".into())
        .spawn(move || loop {
            let status = core.status();
            bar.set_position(status.bytes_done);
            bar.set_message(format!(
                "blocks {}/{}",
                status.blocks_done, status.blocks_total
            ));
            if status.state != "materialising" {
                bar.finish_with_message(format!(
                    "{} ({} blocks)",
                    status.state, status.blocks_done
                ));
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        });
}
