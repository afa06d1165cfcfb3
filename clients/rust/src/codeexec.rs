//! `CodeExec`: one session of the daemon as an agent's code-execution tool.

use crate::client::{self, Client, Connect};
use crate::json::Value;
use crate::{Error, ErrorKind};
use std::path::PathBuf;
use std::time::Duration;

/// Session options (docs/API.md "Session options") and how to reach the
/// daemon. Values are validated by the daemon: a bad one is an
/// [`ErrorKind::Usage`] error naming the field, from [`CodeExec::new`].
#[derive(Clone, Debug)]
pub struct Options {
    /// The kernelmgr home; `None`: as the CLI resolves it.
    pub home: Option<PathBuf>,
    /// The `kernelmgr` binary to start; `None`: `$KERNELMGR_BIN`, else `PATH`.
    pub daemon: Option<PathBuf>,
    /// Start a daemon when none answers (default true).
    pub autostart: bool,
    /// The session options as they are sent (`memory`, `cpus`, `cpu_time`,
    /// `network`, `sandbox`, `python`, `workspace`, `env`, ...).
    pub session: Vec<(String, Value)>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            home: None,
            daemon: None,
            autostart: true,
            session: Vec::new(),
        }
    }
}

impl Options {
    /// Any session option, as a JSON value (replacing an earlier one).
    pub fn set(mut self, key: &str, v: Value) -> Options {
        self.session.retain(|(k, _)| k != key);
        self.session.push((key.to_string(), v));
        self
    }
    /// Memory limit of the session's sandbox, which its kernels share: "512M", "2G".
    pub fn memory(self, m: &str) -> Options {
        self.set("memory", Value::from(m))
    }
    /// CPU rate cap of the session's sandbox, which its kernels share, in CPUs.
    pub fn cpus(self, n: f64) -> Options {
        self.set("cpus", Value::Float(n))
    }
    /// CPU-time budget per block, in seconds.
    pub fn cpu_time(self, s: f64) -> Options {
        self.set("cpu_time", Value::Float(s))
    }
    /// Network inside the sandbox.
    pub fn network(self, on: bool) -> Options {
        self.set("network", Value::from(if on { "on" } else { "off" }))
    }
    /// "strict" or "none".
    pub fn sandbox(self, level: &str) -> Options {
        self.set("sandbox", Value::from(level))
    }
    /// The Python interpreter of the session's kernel (an absolute path).
    pub fn python(self, path: &str) -> Options {
        self.set("python", Value::from(path))
    }
    /// A variable for the code.
    pub fn env(mut self, name: &str, value: &str) -> Options {
        let mut env = match self.session.iter().find(|(k, _)| k == "env") {
            Some((_, v @ Value::Object(_))) => v.clone(),
            _ => Value::object(),
        };
        env.set(name, Value::from(value));
        self = self.set("env", env);
        self
    }
    pub fn home(mut self, home: impl Into<PathBuf>) -> Options {
        self.home = Some(home.into());
        self
    }
    pub fn daemon(mut self, bin: impl Into<PathBuf>) -> Options {
        self.daemon = Some(bin.into());
        self
    }
    pub fn autostart(mut self, on: bool) -> Options {
        self.autostart = on;
        self
    }
}

/// A rich output: its MIME bundle (`image/png` is base64 text, a JSON
/// value its JSON text), and whether it is the value of the block's last
/// expression (else a display).
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub data: Vec<(String, String)>,
    pub is_result: bool,
}

impl Output {
    /// The data for `mime`, if the bundle has it.
    pub fn get(&self, mime: &str) -> Option<&str> {
        self.data
            .iter()
            .find(|(m, _)| m == mime)
            .map(|(_, d)| d.as_str())
    }
}

/// A block's error: `ZeroDivisionError`, `Timeout`, `KeyboardInterrupt`,
/// `ExitStatus` (Bash), ...
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecError {
    pub name: String,
    pub value: String,
    pub traceback: Vec<String>,
}

/// A workspace file a block created, modified or deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileChange {
    pub path: String,
    pub change: String,
}

/// What a [`CodeExec::run`] did, over all its blocks (Markdown with
/// several fences runs several): outputs concatenated in order, the first
/// failing block's error, status and exit code (else the last block's).
#[derive(Clone, Debug, PartialEq)]
pub struct Execution {
    pub stdout: String,
    pub stderr: String,
    pub results: Vec<Output>,
    pub error: Option<ExecError>,
    pub files: Vec<FileChange>,
    /// Bash: the last command's status; Python: 0 or 1; 124 on timeout,
    /// 137 when killed; -1 when no block ran.
    pub exit_code: i64,
    /// "ok", "error", "timeout" or "killed".
    pub status: String,
    /// The daemon's result as it came (every block, truncation notes, ...).
    pub raw: Value,
}

/// An event of a running [`CodeExec::run_streaming`].
#[derive(Clone, Debug, PartialEq)]
pub enum Event<'a> {
    Stdout {
        block: i64,
        text: &'a str,
    },
    Stderr {
        block: i64,
        text: &'a str,
    },
    /// The daemon says something (the block waits for another cell).
    Notice {
        block: i64,
        message: &'a str,
    },
    /// A block finished (its result is in the [`Execution`]).
    BlockDone {
        block: i64,
        status: &'a str,
    },
}

/// What a streaming callback wants next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Interrupt the running code (asked once; the run still returns).
    Interrupt,
}

/// Interrupts a session's running code from any thread (a connection of
/// its own per call): take it with [`CodeExec::interrupter`] before a run.
#[derive(Clone, Debug)]
pub struct Interrupter {
    sock: PathBuf,
    session: String,
}

impl Interrupter {
    pub fn interrupt(&self) -> Result<(), Error> {
        let mut p = Value::object();
        p.set("session", Value::from(self.session.as_str()));
        client::call_once(&self.sock, "interrupt", p).map(|_| ())
    }
}

/// One session of the daemon, for an agent's `code_exec` tool. Its calls
/// take `&mut self` (one request at a time on its connection); use one
/// per thread, and an [`Interrupter`] to stop a run from elsewhere.
pub struct CodeExec {
    client: Client,
    session: String,
    workspace: String,
    created: bool,
    warnings: Vec<String>,
}

fn str_of(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_string()
}

fn bundle(v: &Value, is_result: bool) -> Option<Output> {
    let m = v.as_object()?;
    let data = m
        .iter()
        .map(|(k, x)| {
            (
                k.clone(),
                x.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| x.to_json()),
            )
        })
        .collect();
    Some(Output { data, is_result })
}

/// The [`Execution`] of an exec result.
fn execution(raw: Value) -> Result<Execution, Error> {
    let blocks = raw
        .get("results")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Daemon,
                "exec: the daemon's result has no \"results\" array".into(),
            )
        })?;
    let mut ex = Execution {
        stdout: String::new(),
        stderr: String::new(),
        results: Vec::new(),
        error: None,
        files: Vec::new(),
        exit_code: -1,
        status: "ok".to_string(),
        raw: Value::Null,
    };
    let mut failed = false;
    for b in blocks {
        ex.stdout
            .push_str(b.get("stdout").and_then(Value::as_str).unwrap_or(""));
        ex.stderr
            .push_str(b.get("stderr").and_then(Value::as_str).unwrap_or(""));
        for d in b
            .get("displays")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            ex.results.extend(bundle(d, false));
        }
        if let Some(r) = b.get("result") {
            ex.results.extend(bundle(r, true));
        }
        for f in b
            .get("files")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            ex.files.push(FileChange {
                path: str_of(f, "path"),
                change: str_of(f, "change"),
            });
        }
        let status = str_of(b, "status");
        if !failed {
            ex.exit_code = b.get("exit_code").and_then(Value::as_i64).unwrap_or(-1);
            ex.status = status.clone();
        }
        if let (false, Some(e)) = (failed, b.get("error").filter(|e| !e.is_null())) {
            ex.error = Some(ExecError {
                name: str_of(e, "name"),
                value: str_of(e, "value"),
                traceback: e
                    .get("traceback")
                    .and_then(Value::as_array)
                    .map(|t| {
                        t.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
        failed |= status != "ok";
    }
    ex.raw = raw;
    Ok(ex)
}

impl CodeExec {
    /// Connects to the daemon (starting it when needed) and creates the
    /// session `session` (or opens the existing one) with `options`.
    pub fn new(session: &str, options: Options) -> Result<CodeExec, Error> {
        let mut client = Client::connect(&Connect {
            home: options.home.clone(),
            daemon: options.daemon.clone(),
            autostart: options.autostart,
        })?;
        let mut p = Value::Object(options.session.clone());
        p.set("session", Value::from(session));
        let res = client.call("session.create", p, &mut |_| {})?;
        Ok(CodeExec {
            client,
            session: session.to_string(),
            workspace: str_of(&res, "workspace"),
            created: res.get("created").and_then(Value::as_bool).unwrap_or(false),
            warnings: res
                .get("warnings")
                .and_then(Value::as_array)
                .map(|w| {
                    w.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    pub fn session(&self) -> &str {
        &self.session
    }
    /// The session's workspace directory (a host path).
    pub fn workspace(&self) -> &str {
        &self.workspace
    }
    /// Whether [`CodeExec::new`] created the session (else it existed).
    pub fn created(&self) -> bool {
        self.created
    }
    /// What session.create warned (options not applied to an existing session).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    fn params(&self) -> Value {
        let mut p = Value::object();
        p.set("session", Value::from(self.session.as_str()));
        p
    }

    /// Runs `code`: `lang` "python", "bash" or "auto" (Markdown fences
    /// route each block); `timeout` per block (`None`: the daemon's
    /// default). A block that fails is not an `Err`: it is an
    /// [`Execution`] with its status and error.
    pub fn run(
        &mut self,
        code: &str,
        lang: &str,
        timeout: Option<Duration>,
    ) -> Result<Execution, Error> {
        self.exec(code, lang, timeout, None)
    }

    /// [`CodeExec::run`] with `on_event` called for each event as it
    /// arrives; it returns [`Flow::Interrupt`] to stop the running code.
    pub fn run_streaming<F>(
        &mut self,
        code: &str,
        lang: &str,
        timeout: Option<Duration>,
        mut on_event: F,
    ) -> Result<Execution, Error>
    where
        F: FnMut(&Event) -> Flow,
    {
        self.exec(code, lang, timeout, Some(&mut on_event))
    }

    fn exec(
        &mut self,
        code: &str,
        lang: &str,
        timeout: Option<Duration>,
        on_event: Option<&mut dyn FnMut(&Event) -> Flow>,
    ) -> Result<Execution, Error> {
        let mut p = self.params();
        p.set("code", Value::from(code));
        p.set("lang", Value::from(lang));
        if let Some(t) = timeout {
            p.set("timeout", Value::Float(t.as_secs_f64()));
        }
        let streaming = on_event.is_some();
        if streaming {
            p.set("stream", Value::Bool(true));
        }
        let stop = self.interrupter();
        let mut asked = false;
        let mut cb = on_event;
        let raw = self.client.call("exec", p, &mut |ev: &Value| {
            let f = match cb.as_mut() {
                Some(f) => f,
                None => return,
            };
            let block = ev.get("block").and_then(Value::as_i64).unwrap_or(0);
            let text = |k: &str| ev.get(k).and_then(Value::as_str);
            let event = match (text("event"), text("name")) {
                (Some("stream"), Some("stdout")) => {
                    text("text").map(|t| Event::Stdout { block, text: t })
                }
                (Some("stream"), Some("stderr")) => {
                    text("text").map(|t| Event::Stderr { block, text: t })
                }
                (Some("notice"), _) => text("message").map(|m| Event::Notice { block, message: m }),
                (Some("result"), _) => Some(Event::BlockDone {
                    block,
                    status: ev
                        .get("result")
                        .and_then(|r| r.get("status"))
                        .and_then(Value::as_str)
                        .unwrap_or(""),
                }),
                _ => None, // an event this crate does not know: additions are allowed
            };
            if let Some(e) = event {
                if f(&e) == Flow::Interrupt && !asked {
                    asked = true;
                    let _ = stop.interrupt();
                }
            }
        })?;
        execution(raw)
    }

    /// A handle that interrupts this session from another thread.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter {
            sock: self.client.socket().to_path_buf(),
            session: self.session.clone(),
        }
    }

    /// Stops what runs in the session (state kept).
    pub fn interrupt(&self) -> Result<(), Error> {
        self.interrupter().interrupt()
    }

    /// Fresh kernels: variables cleared, workspace kept.
    pub fn restart(&mut self) -> Result<(), Error> {
        let p = self.params();
        self.client.call("restart", p, &mut |_| {}).map(|_| ())
    }

    /// Writes `data` to `path` in the workspace (replacing it), in
    /// requests of at most 4 MiB.
    pub fn write_file(&mut self, path: &str, data: &[u8]) -> Result<(), Error> {
        let mut off = 0;
        loop {
            let end = (off + (4 << 20)).min(data.len());
            let mut p = self.params();
            p.set("path", Value::from(path));
            p.set("content", Value::from(base64_encode(&data[off..end])));
            p.set("encoding", Value::from("base64"));
            if off > 0 {
                p.set("append", Value::Bool(true));
            }
            self.client.call("files.write", p, &mut |_| {})?;
            off = end;
            if off >= data.len() {
                return Ok(());
            }
        }
    }

    /// Reads the whole file `path` of the workspace (requests of 1 MiB).
    pub fn read_file(&mut self, path: &str) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        loop {
            let mut p = self.params();
            p.set("path", Value::from(path));
            p.set("offset", Value::Int(out.len() as i64));
            p.set("length", Value::Int(1 << 20));
            p.set("encoding", Value::from("base64"));
            let res = self.client.call("files.read", p, &mut |_| {})?;
            let content = res.get("content").and_then(Value::as_str).ok_or_else(|| {
                Error::new(
                    ErrorKind::Daemon,
                    "files.read: the daemon's result has no content".into(),
                )
            })?;
            let bytes = base64_decode(content).ok_or_else(|| {
                Error::new(
                    ErrorKind::Daemon,
                    "files.read: the daemon sent invalid base64".into(),
                )
            })?;
            out.extend_from_slice(&bytes);
            if bytes.is_empty() || res.get("eof").and_then(Value::as_bool).unwrap_or(true) {
                return Ok(out);
            }
        }
    }

    /// The session's history as an nbformat 4 notebook.
    pub fn export(&mut self) -> Result<Value, Error> {
        let p = self.params();
        let res = self.client.call("export", p, &mut |_| {})?;
        res.get("notebook").cloned().ok_or_else(|| {
            Error::new(
                ErrorKind::Daemon,
                "export: the daemon's result has no notebook".into(),
            )
        })
    }

    /// Any other method of the API (docs/API.md) on this session's
    /// connection, with `params` as given (an object; anything else is
    /// sent as `{}`): name the session in them where the method takes one.
    /// Snapshots and forks (session.snapshot, session.restore,
    /// session.fork) get methods of their own here once the daemon has
    /// them.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, Error> {
        let p = if params.as_object().is_some() {
            params
        } else {
            Value::object()
        };
        self.client.call(method, p, &mut |_| {})
    }

    /// Stops the kernels and removes the session (workspace, outputs,
    /// packages).
    pub fn close(mut self) -> Result<(), Error> {
        let p = self.params();
        self.client.call("close", p, &mut |_| {}).map(|_| ())
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(d: &[u8]) -> String {
    let mut s = String::with_capacity((d.len() + 2) / 3 * 4);
    for c in d.chunks(3) {
        let v = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        s.push(B64[(v >> 18) as usize & 63] as char);
        s.push(B64[(v >> 12) as usize & 63] as char);
        s.push(if c.len() > 1 {
            B64[(v >> 6) as usize & 63] as char
        } else {
            '='
        });
        s.push(if c.len() > 2 {
            B64[v as usize & 63] as char
        } else {
            '='
        });
    }
    s
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if b.len() % 4 != 0 {
        return None;
    }
    let val = |c: u8| B64.iter().position(|&x| x == c).map(|p| p as u32);
    let mut out = Vec::with_capacity(b.len() / 4 * 3);
    for (i, q) in b.chunks(4).enumerate() {
        let last = i + 1 == b.len() / 4;
        let pad = if last && q[3] == b'=' {
            if q[2] == b'=' {
                2
            } else {
                1
            }
        } else {
            0
        };
        let a = val(q[0])?;
        let bb = val(q[1])?;
        let c = if pad == 2 { 0 } else { val(q[2])? };
        let d = if pad >= 1 { 0 } else { val(q[3])? };
        let v = a << 18 | bb << 12 | c << 6 | d;
        out.push((v >> 16) as u8);
        if pad < 2 {
            out.push((v >> 8) as u8);
        }
        if pad < 1 {
            out.push(v as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::parse;

    #[test]
    fn base64_round_trips() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(i.as_bytes()), o);
            assert_eq!(base64_decode(o).unwrap(), i.as_bytes());
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(base64_decode(&base64_encode(&all)).unwrap(), all);
        for bad in ["Zg=", "Z!==", "Zg==Zg==", "Zm9v\n"] {
            assert!(base64_decode(bad).is_none(), "{}", bad);
        }
    }

    #[test]
    fn execution_over_blocks() {
        let raw = parse(
            r#"{"results":[
              {"status":"ok","exit_code":0,"stdout":"a\n","stderr":"w\n","result":{"text/plain":"42","application/json":{"k":1}},
               "displays":[{"text/html":"<b>x</b>"}],"error":null,"files":[{"path":"p","change":"created"}]},
              {"status":"error","exit_code":1,"stdout":"b\n","stderr":"","result":null,"displays":[],
               "error":{"name":"E","value":"v","traceback":["t1","t2"]},"files":[]},
              {"status":"ok","exit_code":0,"stdout":"c\n"}],"failed":true}"#,
        )
        .unwrap();
        let ex = execution(raw).unwrap();
        assert_eq!(ex.stdout, "a\nb\nc\n");
        assert_eq!(ex.stderr, "w\n");
        assert_eq!(ex.status, "error");
        assert_eq!(ex.exit_code, 1);
        assert_eq!(ex.error.as_ref().unwrap().name, "E");
        assert_eq!(ex.error.as_ref().unwrap().traceback, vec!["t1", "t2"]);
        assert_eq!(ex.results.len(), 2);
        assert!(!ex.results[0].is_result && ex.results[0].get("text/html") == Some("<b>x</b>"));
        assert!(
            ex.results[1].is_result && ex.results[1].get("application/json") == Some("{\"k\":1}")
        );
        assert_eq!(
            ex.files,
            vec![FileChange {
                path: "p".into(),
                change: "created".into()
            }]
        );
        assert!(execution(parse("{\"results\":3}").unwrap()).is_err());
    }

    #[test]
    fn options_build_the_request() {
        let o = Options::default()
            .memory("1G")
            .cpus(0.5)
            .env("A", "1")
            .env("B", "2")
            .memory("2G");
        let v = Value::Object(o.session).to_json();
        assert_eq!(v, r#"{"cpus":0.5,"env":{"A":"1","B":"2"},"memory":"2G"}"#);
    }

    #[test]
    fn error_kinds_of_rpc_errors() {
        for (text, kind) in [
            (r#"{"code":-32602,"data":{"km_code":2}}"#, ErrorKind::Usage),
            (r#"{"code":-32003}"#, ErrorKind::NoSession),
            (r#"{"code":-32601}"#, ErrorKind::Usage),
            (r#"{"code":-32005}"#, ErrorKind::Daemon),
            (r#"{"code":1}"#, ErrorKind::Internal),
        ] {
            assert_eq!(client::kind_of(&parse(text).unwrap()), kind, "{}", text);
        }
    }

    #[test]
    fn home_like_the_cli() {
        // one test changes the environment (tests run on threads)
        std::env::set_var("KERNELMGR_HOME", "/srv/km");
        assert_eq!(client::resolve_home(), PathBuf::from("/srv/km"));
        std::env::set_var("KERNELMGR_HOME", "");
        std::env::set_var("XDG_STATE_HOME", "/xdg");
        assert_eq!(client::resolve_home(), PathBuf::from("/xdg/kernelmgr"));
        std::env::remove_var("XDG_STATE_HOME");
        std::env::set_var("HOME", "/home/u");
        assert_eq!(
            client::resolve_home(),
            PathBuf::from("/home/u/.local/state/kernelmgr")
        );
        std::env::set_var("KERNELMGR_HOME", "rel");
        assert_eq!(
            client::resolve_home(),
            std::env::current_dir().unwrap().join("rel")
        );
        std::env::remove_var("KERNELMGR_HOME");
    }
}
