//! A client of the kernelmgr daemon (docs/API.md), std only, with a
//! [`CodeExec`] tool type shaped for an agent framework's `code_exec`:
//!
//! ```no_run
//! use kernelmgr::{CodeExec, Options};
//! let mut tool = CodeExec::new("agent-1", Options::default().memory("512M"))?;
//! let ex = tool.run("print(6 * 7)", "python", None)?;
//! assert_eq!(ex.stdout, "42\n");
//! tool.close()?;
//! # Ok::<(), kernelmgr::Error>(())
//! ```
//!
//! The daemon is found as the CLI finds it: the socket
//! `$KERNELMGR_HOME/kernelmgr.sock`, the home resolved by
//! [`client::resolve_home`]. When none answers, `kernelmgr serve` is
//! started (unless [`Options::autostart`] is false) from
//! [`Options::daemon`], else `$KERNELMGR_BIN`, else `kernelmgr` on `PATH`.
//! docs/EMBEDDING.md is the manual.

pub mod client;
mod codeexec;
pub mod json;

pub use codeexec::{
    CodeExec, Event, ExecError, Execution, FileChange, Flow, Interrupter, Options, Output,
};

use std::fmt;

/// What kind of failure an [`Error`] is: the CLI's exit statuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Refused input: an option or field the daemon refused (it names it),
    /// a bad session name or path. Code 2.
    Usage,
    /// No such session. Code 3.
    NoSession,
    /// A kernel could not be started. Code 4.
    Kernel,
    /// The daemon could not be reached or started, broke the protocol,
    /// closed the connection, or is busy. Code 5.
    Daemon,
    /// I/O error, out of memory, the daemon's internal error. Code 6.
    Internal,
}

impl ErrorKind {
    /// The kind of a kernelmgr code (2..6; anything else is Internal).
    pub fn from_code(code: i64) -> ErrorKind {
        match code {
            2 => ErrorKind::Usage,
            3 => ErrorKind::NoSession,
            4 => ErrorKind::Kernel,
            5 => ErrorKind::Daemon,
            _ => ErrorKind::Internal,
        }
    }
    /// The kernelmgr code (the CLI's exit status).
    pub fn code(self) -> i32 {
        match self {
            ErrorKind::Usage => 2,
            ErrorKind::NoSession => 3,
            ErrorKind::Kernel => 4,
            ErrorKind::Daemon => 5,
            ErrorKind::Internal => 6,
        }
    }
}

/// A failed call: its kind, the daemon's JSON-RPC code (0 when the error
/// is not the daemon's), and a message naming what failed (for the
/// daemon's errors, its own message, e.g. `session.create: field
/// "memory": must be a size of at least 16M, ...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub rpc_code: i64,
    pub message: String,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: String) -> Error {
        Error {
            kind,
            rpc_code: 0,
            message,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}
