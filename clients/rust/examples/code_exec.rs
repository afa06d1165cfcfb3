//! The crate's example (docs/EMBEDDING.md): a `code_exec` tool as an agent
//! framework would hold it. Creates a session, runs Python with its output
//! streamed, runs Bash, prints each Execution, closes the session.
//!
//!   KERNELMGR_BIN=/path/to/kernelmgr cargo run --offline --example code_exec

use kernelmgr::{CodeExec, Event, Execution, Flow, Options};
use std::time::Duration;

fn show(ex: &Execution) {
    println!("status={} exit_code={}", ex.status, ex.exit_code);
    if !ex.stdout.is_empty() {
        print!("stdout: {}", ex.stdout);
    }
    if !ex.stderr.is_empty() {
        print!("stderr: {}", ex.stderr);
    }
    for r in &ex.results {
        let kind = if r.is_result { "result" } else { "display" };
        println!(
            "{}: {}",
            kind,
            r.get("text/plain").unwrap_or("(no text/plain)")
        );
    }
    if let Some(e) = &ex.error {
        println!("error: {}: {}", e.name, e.value);
    }
    for f in &ex.files {
        println!("file {}: {}", f.change, f.path);
    }
}

fn main() -> Result<(), kernelmgr::Error> {
    let mut tool = CodeExec::new("rust-example", Options::default().memory("1G"))?;
    let timeout = Some(Duration::from_secs(30));

    let ex = tool.run_streaming(
        "for i in range(3):\n    print('python line', i, flush=True)\n6 * 7",
        "python",
        timeout,
        |ev| {
            if let Event::Stdout { text, .. } = ev {
                print!("[stream] {}", text);
            }
            Flow::Continue
        },
    )?;
    show(&ex);

    let ex = tool.run(
        "echo hello from bash > note.txt; cat note.txt",
        "bash",
        timeout,
    )?;
    show(&ex);

    let ex = tool.run("1 / 0", "python", timeout)?;
    show(&ex);

    tool.close()?;
    println!("closed");
    Ok(())
}
