//! The connection to the daemon: where it is (the home, resolved as the
//! CLI resolves it), starting it when none answers, and one JSON-RPC 2.0
//! call with its event notifications (docs/API.md).

use crate::json::{self, Value};
use crate::{Error, ErrorKind};
use std::env;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The daemon API version this crate speaks.
pub const API_VERSION: i64 = 1;
/// The daemon's bound on one line.
pub const MAX_LINE: usize = 64 << 20;
/// How long [`Client::connect`] waits for a daemon it started.
pub const START_TIMEOUT: Duration = Duration::from_secs(45);

extern "C" {
    fn geteuid() -> u32;
    fn setsid() -> i32;
}

/// The kernelmgr home as the CLI resolves it: `$KERNELMGR_HOME`, else
/// `$XDG_STATE_HOME/kernelmgr`, else `$HOME/.local/state/kernelmgr` (HOME
/// unset: `/tmp`); a relative one is made absolute against the current
/// directory.
pub fn resolve_home() -> PathBuf {
    let nonempty = |k: &str| env::var_os(k).filter(|v| !v.is_empty());
    let p = if let Some(h) = nonempty("KERNELMGR_HOME") {
        PathBuf::from(h)
    } else if let Some(x) = nonempty("XDG_STATE_HOME") {
        PathBuf::from(x).join("kernelmgr")
    } else {
        PathBuf::from(env::var_os("HOME").unwrap_or_else(|| "/tmp".into()))
            .join(".local/state/kernelmgr")
    };
    if p.is_absolute() {
        p
    } else {
        env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    }
}

/// The `kernelmgr` binary to start: `explicit`, else `$KERNELMGR_BIN`,
/// else the first `kernelmgr` in an absolute directory of `$PATH`.
pub fn find_daemon(explicit: Option<&Path>) -> Result<PathBuf, Error> {
    let executable = |p: &Path| {
        fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if let Some(p) = explicit {
        return if executable(p) {
            Ok(p.to_path_buf())
        } else {
            Err(Error::new(
                ErrorKind::Daemon,
                format!(
                    "cannot start the daemon: {} is not an executable file",
                    p.display()
                ),
            ))
        };
    }
    if let Some(p) = env::var_os("KERNELMGR_BIN").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        return if executable(&p) {
            Ok(p)
        } else {
            Err(Error::new(
                ErrorKind::Daemon,
                format!(
                    "cannot start the daemon: {} (KERNELMGR_BIN) is not an executable file",
                    p.display()
                ),
            ))
        };
    }
    if let Some(path) = env::var_os("PATH") {
        for d in env::split_paths(&path).filter(|d| d.is_absolute()) {
            let c = d.join("kernelmgr");
            if executable(&c) {
                return Ok(c);
            }
        }
    }
    Err(Error::new(
        ErrorKind::Daemon,
        "cannot start the daemon: no kernelmgr binary (give its path, set KERNELMGR_BIN, or \
         put kernelmgr on PATH)"
            .to_string(),
    ))
}

/// The home's trust check, as the CLI's (kmhome.c): a directory of the
/// effective user's, writable by no one else. A socket in a home others
/// can write may be anyone's daemon.
fn check_home(home: &Path) -> Result<bool, Error> {
    let m = match fs::metadata(home) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(Error::new(
                ErrorKind::Usage,
                format!("{}: {}", home.display(), e),
            ))
        }
    };
    let euid = unsafe { geteuid() };
    let why = if !m.is_dir() {
        Some("is not a directory")
    } else if m.uid() != euid {
        Some("is owned by another user")
    } else if m.mode() & 0o022 != 0 {
        Some("is writable by group or others")
    } else {
        None
    };
    match why {
        None => Ok(true),
        Some(w) => Err(Error::new(
            ErrorKind::Usage,
            format!(
                "the kernelmgr home {} {} (owner uid {}, mode {:04o}): use a home of your own \
                 (KERNELMGR_HOME)",
                home.display(),
                w,
                m.uid(),
                m.mode() & 0o7777
            ),
        )),
    }
}

/// One connection to the daemon: one request at a time.
pub struct Client {
    home: PathBuf,
    sock: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: i64,
    broken: bool,
}

/// How [`Client::connect`] finds and starts the daemon.
#[derive(Clone, Debug, Default)]
pub struct Connect {
    /// The home; `None`: [`resolve_home`].
    pub home: Option<PathBuf>,
    /// The `kernelmgr` to start; `None`: [`find_daemon`]'s order.
    pub daemon: Option<PathBuf>,
    /// Start a daemon when none answers.
    pub autostart: bool,
}

fn dial(sock: &Path) -> std::io::Result<UnixStream> {
    UnixStream::connect(sock)
}

fn start_daemon(bin: &Path, home: &Path, sock: &Path) -> Result<UnixStream, Error> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(home)
        .map_err(|e| {
            Error::new(
                ErrorKind::Usage,
                format!("cannot create {}: {}", home.display(), e),
            )
        })?;
    check_home(home)?;
    let log_path = home.join("daemon.log");
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(0o400000) // O_NOFOLLOW
        .open(&log_path)
        .map_err(|e| {
            Error::new(
                ErrorKind::Daemon,
                format!("cannot open {}: {}", log_path.display(), e),
            )
        })?;
    let log2 = log
        .try_clone()
        .map_err(|e| Error::new(ErrorKind::Internal, e.to_string()))?;
    let mut cmd = Command::new(bin);
    cmd.arg("serve")
        .env("KERNELMGR_HOME", home)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2));
    // its own session: the terminal's signals for this program are not its
    unsafe {
        cmd.pre_exec(|| {
            setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
        Error::new(
            ErrorKind::Daemon,
            format!("cannot start the daemon: {}: {}", bin.display(), e),
        )
    })?;
    let t0 = Instant::now();
    let result = loop {
        if let Ok(s) = dial(sock) {
            break Ok(s);
        }
        if let Ok(Some(status)) = child.try_wait() {
            // it exited: another daemon may have won the race to serve the home
            if let Ok(s) = dial(sock) {
                break Ok(s);
            }
            let tail = fs::read_to_string(&log_path)
                .ok()
                .and_then(|t| t.lines().last().map(str::to_string))
                .unwrap_or_default();
            break Err(Error::new(
                ErrorKind::Daemon,
                format!(
                    "the daemon ({} serve) exited at start ({}): {} (see {})",
                    bin.display(),
                    status,
                    tail,
                    log_path.display()
                ),
            ));
        }
        if t0.elapsed() >= START_TIMEOUT {
            break Err(Error::new(
                ErrorKind::Daemon,
                format!(
                    "the daemon did not come up within {} s (see {})",
                    START_TIMEOUT.as_secs(),
                    log_path.display()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // the daemon is our child: reap it when it ends, whenever that is
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    result
}

/// The kernelmgr code of a JSON-RPC error object (`data.km_code`, else the
/// server range -32000 - code, else usage for the protocol's own codes).
pub(crate) fn kind_of(e: &Value) -> ErrorKind {
    let km = e
        .get("data")
        .and_then(|d| d.get("km_code"))
        .and_then(Value::as_i64);
    let rpc = e.get("code").and_then(Value::as_i64).unwrap_or(0);
    let code = match km {
        Some(k) if k > 0 && k < 100 => k,
        _ if rpc <= -32000 && rpc > -32100 => -32000 - rpc,
        _ if [-32700, -32600, -32601, -32602].contains(&rpc) => 2,
        _ => 6,
    };
    ErrorKind::from_code(code)
}

impl Client {
    /// Connects (starting a daemon when `c.autostart` and none answers) and
    /// pins the API version with `initialize`.
    pub fn connect(c: &Connect) -> Result<Client, Error> {
        let home = c.home.clone().unwrap_or_else(resolve_home);
        let home = if home.is_absolute() {
            home
        } else {
            env::current_dir().map(|d| d.join(&home)).unwrap_or(home)
        };
        let sock = home.join("kernelmgr.sock");
        if sock.as_os_str().len() >= 108 {
            return Err(Error::new(
                ErrorKind::Usage,
                format!(
                    "socket path {} is longer than 107 bytes: use a shorter kernelmgr home",
                    sock.display()
                ),
            ));
        }
        check_home(&home)?;
        let stream = match dial(&sock) {
            Ok(s) => s,
            Err(e) if !c.autostart => {
                return Err(Error::new(
                    ErrorKind::Daemon,
                    format!(
                        "no daemon is running for {} ({}: {})",
                        home.display(),
                        sock.display(),
                        e
                    ),
                ))
            }
            Err(_) => start_daemon(&find_daemon(c.daemon.as_deref())?, &home, &sock)?,
        };
        let writer = stream
            .try_clone()
            .map_err(|e| Error::new(ErrorKind::Internal, e.to_string()))?;
        let mut cl = Client {
            home,
            sock,
            reader: BufReader::new(stream),
            writer,
            next_id: 0,
            broken: false,
        };
        let mut p = Value::object();
        p.set("api_version", Value::Int(API_VERSION));
        p.set("client", Value::from("kernelmgr-rust"));
        cl.call("initialize", p, &mut |_| {})?;
        Ok(cl)
    }

    /// The home this client's daemon serves.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The daemon's socket.
    pub fn socket(&self) -> &Path {
        &self.sock
    }

    /// One request: `method` with `params` (an object); events of the
    /// request (their params) go to `on_event` as they arrive. The result,
    /// or the daemon's error.
    pub fn call(
        &mut self,
        method: &str,
        params: Value,
        on_event: &mut dyn FnMut(&Value),
    ) -> Result<Value, Error> {
        if self.broken {
            return Err(Error::new(
                ErrorKind::Daemon,
                format!(
                    "{}: the connection to the daemon was lost by an earlier call",
                    method
                ),
            ));
        }
        self.next_id += 1;
        let r = roundtrip(
            &mut self.reader,
            &mut self.writer,
            self.next_id,
            method,
            params,
            on_event,
        );
        if let Err(e) = &r {
            if e.rpc_code == 0 && e.kind == ErrorKind::Daemon {
                self.broken = true;
            }
        }
        r
    }
}

/// One request on a connection of its own (interrupt while a call waits).
pub(crate) fn call_once(sock: &Path, method: &str, params: Value) -> Result<Value, Error> {
    let s = dial(sock).map_err(|e| {
        Error::new(
            ErrorKind::Daemon,
            format!("{}: cannot connect to {}: {}", method, sock.display(), e),
        )
    })?;
    let mut w = s
        .try_clone()
        .map_err(|e| Error::new(ErrorKind::Internal, e.to_string()))?;
    let mut r = BufReader::new(s);
    roundtrip(&mut r, &mut w, 1, method, params, &mut |_| {})
}

fn read_line(r: &mut BufReader<UnixStream>, buf: &mut Vec<u8>) -> Result<(), String> {
    buf.clear();
    let n = r
        .by_ref()
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', buf)
        .map_err(|e| e.to_string())?;
    if n == 0 {
        return Err(
            "the daemon closed the connection without a response (did it stop? see \
                    daemon.log)"
                .to_string(),
        );
    }
    if buf.last() != Some(&b'\n') {
        return Err(if buf.len() > MAX_LINE {
            "the daemon sent a line longer than 64 MiB".to_string()
        } else {
            "the daemon closed the connection in the middle of a line".to_string()
        });
    }
    buf.pop();
    Ok(())
}

fn roundtrip(
    r: &mut BufReader<UnixStream>,
    w: &mut UnixStream,
    id: i64,
    method: &str,
    params: Value,
    on_event: &mut dyn FnMut(&Value),
) -> Result<Value, Error> {
    let mut req = Value::object();
    req.set("jsonrpc", Value::from("2.0"));
    req.set("id", Value::Int(id));
    req.set("method", Value::from(method));
    req.set("params", params);
    let mut line = req.to_json();
    line.push('\n');
    w.write_all(line.as_bytes()).map_err(|e| {
        Error::new(
            ErrorKind::Daemon,
            format!("{}: cannot send to the daemon: {}", method, e),
        )
    })?;
    let mut buf = Vec::new();
    loop {
        read_line(r, &mut buf)
            .map_err(|e| Error::new(ErrorKind::Daemon, format!("{}: {}", method, e)))?;
        let text = std::str::from_utf8(&buf).map_err(|_| {
            Error::new(
                ErrorKind::Daemon,
                format!("{}: the daemon sent a line that is not UTF-8", method),
            )
        })?;
        let msg = json::parse(text).map_err(|e| {
            Error::new(
                ErrorKind::Daemon,
                format!("{}: the daemon sent {}", method, e),
            )
        })?;
        if msg.as_object().is_none() {
            return Err(Error::new(
                ErrorKind::Daemon,
                format!("{}: the daemon sent a line that is not an object", method),
            ));
        }
        if let Some(m) = msg.get("method") {
            let ps = msg.get("params");
            let ours = ps.and_then(|p| p.get("request_id")).and_then(Value::as_i64) == Some(id);
            if m.as_str() == Some("event") && ours {
                if let Some(p) = ps {
                    on_event(p);
                }
            }
            continue;
        }
        match msg.get("id") {
            Some(Value::Null) => {}
            Some(v) if v.as_i64() == Some(id) => {}
            _ => continue, // not ours
        }
        if let Some(e) = msg.get("error") {
            let message = e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("the daemon reported an error without a message")
                .to_string();
            let mut err = Error::new(kind_of(e), message);
            err.rpc_code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
            return Err(err);
        }
        return match msg.get("result") {
            Some(v) => Ok(v.clone()),
            None => Err(Error::new(
                ErrorKind::Daemon,
                format!(
                    "{}: the daemon sent a response without result or error",
                    method
                ),
            )),
        };
    }
}
