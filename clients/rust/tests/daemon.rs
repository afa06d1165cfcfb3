//! The crate against a real daemon: each test has a home of its own in
//! /tmp, the daemon started by the crate from $KERNELMGR_BIN and shut down
//! at the end. Without KERNELMGR_BIN every test says it skips and passes
//! (tests/e2e/test_client_rust.py sets it to build/kernelmgr).

use kernelmgr::client::{Client, Connect};
use kernelmgr::json::Value;
use kernelmgr::{CodeExec, ErrorKind, Event, Flow, Options};
use std::fs;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A home with its config; shuts its daemon down and removes itself.
struct Home {
    dir: PathBuf,
}

impl Home {
    fn new() -> Option<Home> {
        if std::env::var_os("KERNELMGR_BIN").map_or(true, |v| v.is_empty()) {
            // straight to the fd: the test harness captures eprintln!
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: KERNELMGR_BIN is not set (the path of a kernelmgr binary): this test \
                 needs a real daemon"
            );
            return None;
        }
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let dir = PathBuf::from(format!(
            "/tmp/kmrs{}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst),
            nanos
        ));
        fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let sandbox = std::env::var("KM_TEST_SANDBOX").unwrap_or_else(|_| "strict".into());
        let mut cfg = Value::object();
        cfg.set("sandbox", Value::from(sandbox));
        cfg.set("python", Value::from("/usr/bin/python3"));
        fs::write(dir.join("config.json"), cfg.to_json()).unwrap();
        Some(Home { dir })
    }
    fn options(&self) -> Options {
        Options::default().home(&self.dir)
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let c = Connect {
            home: Some(self.dir.clone()),
            daemon: None,
            autostart: false,
        };
        if let Ok(mut cl) = Client::connect(&c) {
            let _ = cl.call("shutdown", Value::object(), &mut |_| {});
        }
        // the daemon removes its socket as it exits: wait for that (bounded)
        let sock = self.dir.join("kernelmgr.sock");
        for _ in 0..600 {
            if !sock.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

macro_rules! home {
    () => {
        match Home::new() {
            Some(h) => h,
            None => return,
        }
    };
}

const T: Option<Duration> = Some(Duration::from_secs(60));

#[test]
fn runs_python_and_bash() {
    let h = home!();
    let mut t = CodeExec::new("rs-basic", h.options()).unwrap();
    assert!(t.created());
    assert!(t.workspace().starts_with('/'));
    let ex = t.run("x = 6 * 7\nprint('hi')\nx", "python", T).unwrap();
    assert_eq!(ex.stdout, "hi\n");
    assert_eq!(ex.status, "ok");
    assert_eq!(ex.exit_code, 0);
    assert!(ex.error.is_none());
    let r = ex.results.iter().find(|o| o.is_result).expect("a result");
    assert_eq!(r.get("text/plain"), Some("42"));
    let ex = t
        .run(
            "echo out; echo err >&2; echo data > f.txt; sh -c 'exit 3'",
            "bash",
            T,
        )
        .unwrap();
    assert_eq!(ex.stdout, "out\n");
    assert_eq!(ex.stderr, "err\n");
    assert_eq!(ex.exit_code, 3);
    assert_eq!(ex.status, "error");
    assert!(
        ex.files
            .iter()
            .any(|f| f.path == "f.txt" && f.change == "created"),
        "{:?}",
        ex.files
    );
    let ex = t.run("print(x)\n1/0", "python", T).unwrap();
    assert_eq!(ex.stdout, "42\n");
    let e = ex.error.expect("an error");
    assert_eq!(e.name, "ZeroDivisionError");
    assert!(!e.traceback.is_empty());
    assert_eq!(ex.exit_code, 1);
    // Markdown: one block per fence
    let md = "Text\n```python\nprint('p')\n```\n```bash\necho b\n```\n";
    let ex = t.run(md, "auto", T).unwrap();
    assert_eq!(ex.stdout, "p\nb\n");
    assert_eq!(ex.raw.get("results").unwrap().as_array().unwrap().len(), 2);
    let nb = t.export().unwrap();
    assert!(nb
        .get("cells")
        .and_then(Value::as_array)
        .map_or(false, |c| !c.is_empty()));
    t.close().unwrap();
}

#[test]
fn streams_events_as_they_arrive() {
    let h = home!();
    let mut t = CodeExec::new("rs-stream", h.options()).unwrap();
    let mut seen = String::new();
    let mut done = Vec::new();
    let ex = t
        .run_streaming(
            "import sys\nfor i in range(3): print('line', i, flush=True)\nprint('e', file=sys.stderr)",
            "python",
            T,
            |ev| {
                match ev {
                    Event::Stdout { text, .. } => seen.push_str(text),
                    Event::BlockDone { status, .. } => done.push(status.to_string()),
                    _ => {}
                }
                Flow::Continue
            },
        )
        .unwrap();
    assert_eq!(seen, "line 0\nline 1\nline 2\n");
    assert_eq!(seen, ex.stdout);
    assert_eq!(done, vec!["ok"]);
    t.close().unwrap();
}

#[test]
fn interrupts_a_running_cell() {
    let h = home!();
    let mut t = CodeExec::new("rs-intr", h.options()).unwrap();
    let code =
        "import time\nkept = 5\nprint('started', flush=True)\ntime.sleep(300)\nprint('late')";
    // by the callback
    let ex = t
        .run_streaming(
            code,
            "python",
            Some(Duration::from_secs(600)),
            |ev| match ev {
                Event::Stdout { text, .. } if text.contains("started") => Flow::Interrupt,
                _ => Flow::Continue,
            },
        )
        .unwrap();
    assert_eq!(
        ex.error.as_ref().map(|e| e.name.as_str()),
        Some("KeyboardInterrupt"),
        "{:?}",
        ex.raw
    );
    assert!(!ex.stdout.contains("late"));
    // from another thread, with an Interrupter
    let stop = t.interrupter();
    let mut th = None;
    let ex = t
        .run_streaming(code, "python", Some(Duration::from_secs(600)), |ev| {
            if let Event::Stdout { text, .. } = ev {
                if text.contains("started") && th.is_none() {
                    let s = stop.clone();
                    th = Some(std::thread::spawn(move || s.interrupt()));
                }
            }
            Flow::Continue
        })
        .unwrap();
    th.expect("started").join().unwrap().unwrap();
    assert_eq!(
        ex.error.as_ref().map(|e| e.name.as_str()),
        Some("KeyboardInterrupt")
    );
    // state kept; restart clears it
    assert_eq!(t.run("print(kept)", "python", T).unwrap().stdout, "5\n");
    t.restart().unwrap();
    let ex = t.run("print(kept)", "python", T).unwrap();
    assert_eq!(ex.error.map(|e| e.name), Some("NameError".to_string()));
    t.close().unwrap();
}

#[test]
fn errors_name_what_failed() {
    let h = home!();
    let e = CodeExec::new("rs-bad", h.options().memory("lots"))
        .err()
        .expect("refused");
    assert_eq!(e.kind, ErrorKind::Usage);
    assert_eq!(e.rpc_code, -32602);
    assert!(e.message.contains("\"memory\""), "{}", e);
    let e = CodeExec::new("rs-bad", h.options().set("frobnicate", Value::Int(1)))
        .err()
        .unwrap();
    assert!(e.message.contains("frobnicate"), "{}", e);
    let e = CodeExec::new("../x", h.options()).err().unwrap();
    assert_eq!(e.kind, ErrorKind::Usage);
    // a session closed under a handle: no such session
    let a = CodeExec::new("rs-gone", h.options()).unwrap();
    let mut b = CodeExec::new("rs-gone", h.options()).unwrap();
    assert!(!b.created());
    a.close().unwrap();
    let e = b.restart().unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoSession, "{}", e);
    // the daemon's refusal of a method it lacks
    let e = b.call("no.such.method", Value::object()).unwrap_err();
    assert_eq!(e.rpc_code, -32601);
    // the connection's tier lowered: what the tier may not ask is refused
    let mut tier = Value::object();
    tier.set("tier", Value::from("mcp"));
    assert_eq!(
        b.call("initialize", tier)
            .unwrap()
            .get("tier")
            .and_then(Value::as_str),
        Some("mcp")
    );
    let mut cf = Value::object();
    cf.set("session", Value::from("rs-gone"));
    let e = b.call("connection_file", cf).unwrap_err();
    assert!(e.message.contains("MCP"), "{}", e);
    // no daemon, no autostart
    let other = Home::new().unwrap();
    let e = CodeExec::new("x", other.options().autostart(false))
        .err()
        .unwrap();
    assert_eq!(e.kind, ErrorKind::Daemon);
    // a daemon binary that is not one
    let e = CodeExec::new("x", other.options().daemon("/nonexistent/kernelmgr"))
        .err()
        .unwrap();
    assert!(e.message.contains("/nonexistent/kernelmgr"), "{}", e);
}

#[test]
fn files_both_ways() {
    let h = home!();
    let mut t = CodeExec::new("rs-files", h.options()).unwrap();
    let data: Vec<u8> = (0..(5usize << 20) + 3)
        .map(|i| (i * 7 + i / 251) as u8)
        .collect();
    t.write_file("d/blob.bin", &data).unwrap();
    assert_eq!(t.read_file("d/blob.bin").unwrap(), data);
    let ex = t.run("wc -c < d/blob.bin", "bash", T).unwrap();
    assert_eq!(ex.stdout.trim(), data.len().to_string());
    t.write_file("empty", b"").unwrap();
    assert_eq!(t.read_file("empty").unwrap(), b"");
    let e = t.read_file("../etc/passwd").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Usage);
    t.close().unwrap();
}
