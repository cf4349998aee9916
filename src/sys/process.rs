//! Processes as `/proc` shows them: whether a process whose read the view
//! holds has since been interrupted or has gone, whether this process may
//! use FUSE passthrough, and leaving at once when threads are stuck.
//!
//! fuser 0.18 answers the kernel's FUSE INTERRUPT itself, with ENOSYS, and
//! never tells the filesystem (its `request.rs`: "TODO: handle
//! FUSE_INTERRUPT"); that answer also makes the kernel stop sending them
//! on the connection. Most parked reads are page-cache read-ahead, which
//! the kernel never interrupts anyway. So the view asks `/proc` instead
//! about each process it holds a read for.

use std::fs;

/// What became of a process (a thread: FUSE requests carry its id) that
/// made a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requester {
    /// Still there and waiting.
    Waiting,
    /// A signal it will act on is pending: a handler to run, or a fatal
    /// one (kill -9, Ctrl-C); its read should end with EINTR, as a FUSE
    /// INTERRUPT would have it.
    Interrupted,
    /// It has exited (or is a zombie).
    Gone,
}

/// Signals that do not ask a process to stop what it is doing: job
/// control (a reader stopped with Ctrl-Z waits on when continued) and
/// notices a program may catch in passing (SIGCHLD, SIGWINCH, SIGURG).
const NOT_INTERRUPTING: [i32; 8] = [
    libc::SIGSTOP,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGCONT,
    libc::SIGCHLD,
    libc::SIGWINCH,
    libc::SIGURG,
];

/// The state of the thread `tid` (as a FUSE request header gives it; 0 when
/// the kernel could not name it in this pid namespace: taken as waiting).
pub fn requester(tid: u32) -> Requester {
    if tid == 0 {
        return Requester::Waiting;
    }
    match fs::read_to_string(format!("/proc/{tid}/status")) {
        Ok(status) => requester_of(&status),
        Err(_) => Requester::Gone,
    }
}

/// [`requester`] from the text of `/proc/TID/status`.
pub fn requester_of(status: &str) -> Requester {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
    };
    let mask = |name: &str| field(name).and_then(|hex| u64::from_str_radix(hex, 16).ok());
    if field("State:").is_some_and(|state| state.starts_with('Z') || state.starts_with('X')) {
        return Requester::Gone;
    }
    let pending = mask("SigPnd:").unwrap_or(0) | mask("ShdPnd:").unwrap_or(0);
    let ignored = NOT_INTERRUPTING
        .iter()
        .fold(0u64, |bits, &signal| bits | 1 << (signal - 1));
    if pending & !mask("SigBlk:").unwrap_or(0) & !ignored != 0 {
        Requester::Interrupted
    } else {
        Requester::Waiting
    }
}

/// Whether this process has CAP_SYS_ADMIN, which the kernel asks of a
/// FUSE server to open files in passthrough mode.
pub fn may_use_passthrough() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & 1 << CAP_SYS_ADMIN != 0)
}

/// Ends the process now, with `code`, without running exit handlers or
/// waiting for other threads: a thread stuck in the kernel (a read from a
/// hung filesystem) would hold a normal exit, and libhdf5's exit handler
/// takes a lock such a thread may hold.
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stderr().flush();
    // SAFETY: _exit takes no pointers and does not return.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: &str, pending: &str, shared: &str, blocked: &str) -> String {
        format!(
            "Name:\tcat\nState:\t{state}\nSigQ:\t0/1\nSigPnd:\t{pending}\nShdPnd:\t{shared}\n\
             SigBlk:\t{blocked}\nSigIgn:\t0000000000000000\n"
        )
    }

    #[test]
    fn a_pending_signal_interrupts_unless_blocked_or_job_control() {
        let zero = "0000000000000000";
        let int = "0000000000000002"; // SIGINT
        let kill = "0000000000000100"; // SIGKILL
        let tstp = "0000000000080000"; // SIGTSTP
        let waiting = status("D (disk sleep)", zero, zero, zero);
        assert_eq!(requester_of(&waiting), Requester::Waiting);
        let killed = status("D (disk sleep)", kill, zero, zero);
        assert_eq!(requester_of(&killed), Requester::Interrupted);
        let shared = status("S (sleeping)", zero, int, zero);
        assert_eq!(requester_of(&shared), Requester::Interrupted);
        let blocked = status("S (sleeping)", int, zero, int);
        assert_eq!(requester_of(&blocked), Requester::Waiting);
        let stopped = status("D (disk sleep)", tstp, zero, zero);
        assert_eq!(requester_of(&stopped), Requester::Waiting);
        let zombie = status("Z (zombie)", zero, zero, zero);
        assert_eq!(requester_of(&zombie), Requester::Gone);
        assert_eq!(requester(std::process::id()), Requester::Waiting);
    }
}
