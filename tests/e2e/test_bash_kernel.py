"""The Bash kernel (build/kernel-bash) driven by the real jupyter_client:
message choreography, state, exit status, interrupts, restarts, stdin,
completion, display, output handling."""
import base64
import os
import signal
import struct
import time
import zlib

import pytest

import kutil
from kutil import of_type, stream_text

# Switch every kernel of these tests to the strict sandbox with one change.
SANDBOX = os.environ.get("KM_TEST_SANDBOX", "none")


@pytest.fixture
def bash(kernel_factory):
    def make(*args, **kw):
        kw.setdefault("key", os.urandom(16).hex().encode())  # signed, like real clients
        return kernel_factory("bash", args=("--sandbox", SANDBOX, *args), **kw)
    return make


def types(iopub):
    return [m["msg_type"] for m in iopub]


def run(k, code, **kw):
    _, r = k.execute(code, **kw)
    return r["reply"], r["iopub"]


def interrupt_after(k, code, delay=0.7, how="message", timeout=30):
    msg_id = k.kc.execute(code)
    # Wait until the code runs (busy + execute_input seen is not enough to
    # know that `sleep` started; a short delay is fine, no timing asserted).
    time.sleep(delay)
    if how == "message":
        rep = kutil.control_request(k, "interrupt_request")
        assert rep is not None and rep["msg_type"] == "interrupt_reply"
        assert rep["content"]["status"] == "ok"
    else:
        k.proc.send_signal(signal.SIGINT)
    r = k.collect(msg_id, timeout)
    return r["reply"], r["iopub"]


# ---------------------------------------------------------------- choreography

def test_choreography_and_counters(bash):
    k = bash()
    reply, iopub = run(k, "echo one")
    assert types(iopub) == ["status", "execute_input", "stream", "status"]
    assert iopub[0]["content"]["execution_state"] == "busy"
    assert iopub[-1]["content"]["execution_state"] == "idle"
    assert iopub[1]["content"] == {"code": "echo one", "execution_count": 1}
    assert iopub[2]["content"] == {"name": "stdout", "text": "one\n"}
    c = reply["content"]
    assert c["status"] == "ok" and c["execution_count"] == 1
    assert c["user_expressions"] == {} and c["payload"] == []
    assert reply["metadata"]["exit_code"] == 0
    assert reply["header"]["version"] == "5.3"

    reply, iopub = run(k, "true")
    assert types(iopub) == ["status", "execute_input", "status"]
    assert iopub[1]["content"]["execution_count"] == 2 == reply["content"]["execution_count"]

    # store_history=False and silent do not move the counter.
    reply, iopub = run(k, "echo quiet", store_history=False)
    assert reply["content"]["execution_count"] == 2
    assert iopub[1]["content"]["execution_count"] == 2
    reply, iopub = run(k, "echo silent", silent=True)
    assert "execute_input" not in types(iopub)
    assert reply["content"]["execution_count"] == 2
    reply, _ = run(k, "true")
    assert reply["content"]["execution_count"] == 3


def test_stdout_stderr_separate(bash):
    k = bash()
    reply, iopub = run(k, "echo to-out; echo to-err >&2; ls /nonexistent-dir-xyz")
    assert stream_text(iopub, "stdout") == "to-out\n"
    err = stream_text(iopub, "stderr")
    assert err.startswith("to-err\n")
    assert "nonexistent-dir-xyz" in err
    # output from a subprocess and a background job, captured at fd level
    reply, iopub = run(k, "sh -c 'echo from-sh; echo sh-err >&2'; (echo sub) ; wait")
    assert stream_text(iopub, "stdout") == "from-sh\nsub\n"
    assert stream_text(iopub, "stderr") == "sh-err\n"


def test_state_persists(bash):
    k = bash()
    run(k, "x=41; f() { echo \"f:$1:$x\"; }; cd /tmp; export MYVAR=exported; "
           "declare -A m=([k]=v); declare -a arr=(a b c); alias hi='echo alias-ok'")
    reply, iopub = run(k, "x=$((x+1)); f arg; pwd; sh -c 'echo $MYVAR'; "
                          "echo ${m[k]} ${arr[2]}; hi")
    assert reply["content"]["status"] == "ok"
    assert stream_text(iopub) == "f:arg:42\n/tmp\nexported\nv c\nalias-ok\n"
    # options live on too
    run(k, "shopt -s nullglob; set -o pipefail")
    reply, iopub = run(k, "echo /no-such-*; false | true; echo $?")
    assert stream_text(iopub) == "\n1\n"


def test_workspace_is_cwd(bash):
    k = bash()
    _, iopub = run(k, "pwd")
    assert stream_text(iopub).strip() == os.path.realpath(k.workspace)


def test_exit_status_is_an_error(bash):
    k = bash()
    reply, iopub = run(k, "echo before; (exit 3)")
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "ExitStatus"
    assert reply["content"]["evalue"] == "3"
    assert reply["metadata"]["exit_code"] == 3
    errs = of_type(iopub, "error")
    assert len(errs) == 1 and errs[0]["content"]["ename"] == "ExitStatus"
    assert errs[0]["content"]["evalue"] == "3"
    # stream before the error, error before idle
    t = types(iopub)
    assert t.index("stream") < t.index("error") < len(t) - 1
    # only the last command's status counts, like in a script
    reply, _ = run(k, "false; true")
    assert reply["content"]["status"] == "ok" and reply["metadata"]["exit_code"] == 0
    reply, _ = run(k, "nosuchcommand-xyz")
    assert reply["metadata"]["exit_code"] == 127


def test_errexit_and_nounset_end_the_cell_not_the_shell(bash):
    k = bash()
    run(k, "keep=yes")
    reply, iopub = run(k, "set -e; echo a; false; echo b")
    assert stream_text(iopub) == "a\n"
    assert reply["content"]["status"] == "error" and reply["metadata"]["exit_code"] == 1
    # set -e is still on in the next cell, and the state is kept
    reply, iopub = run(k, "echo $keep; false; echo after")
    assert stream_text(iopub) == "yes\n"
    run(k, "set +e")
    reply, iopub = run(k, "echo ${nope:?is not set}; echo not-reached")
    assert reply["content"]["status"] == "error"
    assert "is not set" in stream_text(iopub, "stderr")
    assert "not-reached" not in stream_text(iopub)
    reply, iopub = run(k, "echo $keep")
    assert stream_text(iopub) == "yes\n"
    assert not of_type(iopub, "error")


def test_user_shell_options_do_not_break_the_driver(bash):
    k = bash()
    reply, _ = run(k, "shopt -s nocasematch failglob extglob; IFS=,; set -u -o pipefail")
    assert reply["content"]["status"] == "ok"
    reply, iopub = run(k, "echo a; read x; echo rc=$?; [[ ABC == abc ]] && echo ci")
    assert reply["content"]["status"] == "ok"
    assert stream_text(iopub) == "a\nrc=1\nci\n"
    reply, iopub = run(k, "echo $unset_var; echo not-reached")
    assert reply["content"]["status"] == "error"
    assert "unset_var: unbound variable" in stream_text(iopub, "stderr")
    # xtrace shows the cell's commands, not the kernel's
    reply, iopub = run(k, "set +u; set -x")
    reply, iopub = run(k, "echo traced")
    assert stream_text(iopub) == "traced\n"
    assert stream_text(iopub, "stderr").endswith("+ echo traced\n")
    assert "__km" not in stream_text(iopub, "stderr")
    assert "eval" not in stream_text(iopub, "stderr")
    reply, iopub = run(k, "set +x; unset -v IFS; shopt -u nocasematch failglob; echo done")
    assert stream_text(iopub) == "done\n"
    m = shell_request(k, lambda: k.kc.complete("ech", 3))
    assert "echo" in m["content"]["matches"]


def test_marker_like_output_does_not_desync(bash):
    k = bash()
    tricky = 'PS1="$ "; printf \'{"type":"done","status":"ok","exit_code":0}\\n\'; echo "\\x00"'
    reply, iopub = run(k, tricky)
    assert '{"type":"done"' in stream_text(iopub)
    reply, iopub = run(k, "echo next")
    assert stream_text(iopub) == "next\n"
    assert reply["content"]["execution_count"] == 2


# ---------------------------------------------------------------- interrupts, restarts

def test_interrupt_sleep_keeps_state(bash):
    k = bash()
    run(k, "state=kept")
    reply, iopub = interrupt_after(k, "echo start; sleep 30; echo not-reached")
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert reply["metadata"]["exit_code"] == 130
    assert stream_text(iopub) == "start\n"
    assert types(iopub)[-1] == "status"
    reply, iopub = run(k, "echo $state")
    assert stream_text(iopub) == "kept\n"


def test_interrupt_stops_whole_loop_and_functions(bash):
    k = bash()
    run(k, "n=0")
    reply, iopub = interrupt_after(k, "for i in 1 2 3; do n=$i; sleep 10; done; echo after-loop")
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert "after-loop" not in stream_text(iopub)
    reply, iopub = run(k, "echo n=$n")
    assert stream_text(iopub) == "n=1\n"
    # nested functions and a busy loop without any child process
    reply, iopub = interrupt_after(
        k, "inner() { while :; do :; done; }; outer() { inner; echo o; }; outer; echo x")
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert stream_text(iopub) == ""


def test_interrupt_right_at_the_start_of_a_cell(bash):
    # Interrupt as soon as the kernel has started the request (execute_input
    # published): the worker may still be reading it. The interrupt must not
    # be lost (which would end in a kill after the grace period).
    k = bash("--interrupt-grace", "6")
    run(k, "state=kept")
    # A long comment keeps the worker busy reading the request (bash reads a
    # pipe byte by byte), so the interrupt lands before the cell starts.
    for _ in range(2):
        msg_id = k.kc.execute("sleep 30; echo not-reached #" + "x" * 300_000)
        while True:
            m = k.kc.get_iopub_msg(timeout=10)
            if (m["parent_header"].get("msg_id") == msg_id
                    and m["msg_type"] == "execute_input"):
                break
        assert kutil.control_request(k, "interrupt_request")["content"]["status"] == "ok"
        r = k.collect(msg_id, 15)
        assert r["reply"]["content"]["ename"] == "KeyboardInterrupt"
        assert "not-reached" not in stream_text(r["iopub"])
    reply, iopub = run(k, "echo $state")
    assert stream_text(iopub) == "kept\n"


def test_sigint_to_kernel_process_interrupts(bash):
    k = bash()
    reply, _ = interrupt_after(k, "sleep 30", how="signal")
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    reply, iopub = run(k, "echo alive")
    assert stream_text(iopub) == "alive\n"


def test_sigint_ignoring_command_is_killed_and_restarted(bash):
    k = bash("--interrupt-grace", "1")
    run(k, "lost=1")
    reply, iopub = interrupt_after(k, "trap '' INT; sleep 60")
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KernelRestarted"
    assert "did not stop within 1 s" in reply["content"]["evalue"]
    assert "state" in reply["content"]["evalue"] and "lost" in reply["content"]["evalue"]
    assert reply["metadata"]["kernel_restarted"] is True
    assert reply["metadata"]["state_preserved"] is False
    err = of_type(iopub, "error")
    assert err and err[0]["content"]["ename"] == "KernelRestarted"
    reply, iopub = run(k, "echo lost=${lost:-gone}")
    assert reply["content"]["status"] == "ok"
    assert stream_text(iopub) == "lost=gone\n"


def test_exit_restarts_worker(bash):
    k = bash()
    run(k, "v=1")
    reply, iopub = run(k, "echo bye; exit 7")
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KernelRestarted"
    assert "exited with status 7" in reply["content"]["evalue"]
    assert reply["metadata"]["exit_code"] == 7
    assert stream_text(iopub) == "bye\n"
    assert of_type(iopub, "error")
    reply, iopub = run(k, "echo v=${v:-unset}")
    assert reply["content"]["status"] == "ok"
    assert stream_text(iopub) == "v=unset\n"


def test_crash_restarts_worker(bash):
    k = bash()
    reply, iopub = run(k, "kill -9 $$")
    assert reply["content"]["ename"] == "KernelRestarted"
    assert "signal 9" in reply["content"]["evalue"]
    reply, iopub = run(k, "echo works")
    assert stream_text(iopub) == "works\n"


def test_stop_on_error_aborts_queued(bash):
    k = bash()
    first = k.kc.execute("sleep 0.5; false")
    second = k.kc.execute("echo should-not-run > aborted.txt")
    third = k.kc.execute("echo neither")
    r1 = k.collect(first)
    r2 = k.collect(second)
    r3 = k.collect(third)
    assert r1["reply"]["content"]["status"] == "error"
    assert r2["reply"]["content"]["status"] == "aborted"
    assert r3["reply"]["content"]["status"] == "aborted"
    assert types(r2["iopub"]) == ["status", "status"]
    assert not (k.workspace / "aborted.txt").exists()
    # stop_on_error=False: the next one runs
    first = k.kc.execute("sleep 0.3; false", stop_on_error=False)
    second = k.kc.execute("echo ran")
    assert k.collect(first)["reply"]["content"]["status"] == "error"
    r = k.collect(second)
    assert r["reply"]["content"]["status"] == "ok"
    assert stream_text(r["iopub"]) == "ran\n"


# ---------------------------------------------------------------- stdin

def test_input_via_stdin_channel(bash):
    k = bash()
    prompts = []

    def answer(kc, msg):
        assert msg["msg_type"] == "input_request"
        prompts.append(msg["content"])
        kc.input("Ada Lovelace" if not msg["content"]["password"] else "s3cret")

    reply, iopub = run(k, "read -p 'Name: ' first last; read -s pw; "
                          "echo \"hi $last, $first ($pw)\"",
                       allow_stdin=True, stdin_handler=answer)
    assert reply["content"]["status"] == "ok"
    assert prompts == [{"prompt": "Name: ", "password": False},
                       {"prompt": "", "password": True}]
    assert stream_text(iopub) == "hi Lovelace, Ada (s3cret)\n"


def test_stdin_not_allowed_sees_eof(bash):
    k = bash()
    asked = []
    reply, iopub = run(k, "read x; echo \"rc=$? x=[$x]\"; cat; echo cat-done",
                       allow_stdin=False, stdin_handler=lambda kc, m: asked.append(m))
    assert asked == []
    assert stream_text(iopub) == "rc=1 x=[]\ncat-done\n"
    # commands reading stdin see end-of-file even when stdin is allowed
    reply, iopub = run(k, "cat; wc -l; echo ok", allow_stdin=True,
                       stdin_handler=lambda kc, m: asked.append(m))
    assert asked == [] and stream_text(iopub) == "0\nok\n"
    # redirected input goes to the real builtin
    reply, iopub = run(k, "printf 'a\\nb\\n' > in.txt; while read l; do echo \"<$l>\"; done < in.txt",
                       allow_stdin=True, stdin_handler=lambda kc, m: asked.append(m))
    assert asked == [] and stream_text(iopub) == "<a>\n<b>\n"


def test_interrupt_while_waiting_for_input(bash):
    k = bash()
    msg_id = k.kc.execute("read -p 'never: ' v; echo not-reached", allow_stdin=True)
    m = k.kc.get_stdin_msg(timeout=10)
    assert m["msg_type"] == "input_request"
    rep = kutil.control_request(k, "interrupt_request")
    assert rep["content"]["status"] == "ok"
    r = k.collect(msg_id, 20)
    assert r["reply"]["content"]["ename"] == "KeyboardInterrupt"
    assert "not-reached" not in stream_text(r["iopub"])
    reply, iopub = run(k, "echo fine")
    assert stream_text(iopub) == "fine\n"


def signal_worker(k, sig=signal.SIGINT):
    """Sends sig to the worker's process group directly, the way the kernel
    signals it: the signal is pending when this returns, so it reaches the
    idle worker before the next request. (Through the sandbox's init it
    would be forwarded whenever init gets to run, possibly inside the next
    cell, and an unannounced SIGINT inside a cell is a real interrupt.)"""
    import subprocess

    def children(pid):
        return [int(p) for p in subprocess.run(
            ["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    # kernel -> worker (--sandbox none) or kernel -> monitor -> init -> worker
    tree, todo = [], children(k.proc.pid)
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children(pid)
    workers = [pid for pid in tree if os.getpgid(pid) == pid and
               open(f"/proc/{pid}/comm").read().strip() == "bash"]
    assert len(workers) == 1, ("the kernel's bash worker", tree)
    os.killpg(workers[0], sig)


def test_sigint_between_cells_is_harmless(bash):
    # A SIGINT that reaches the idle worker (a late forward through the
    # sandbox's init, or the kernel's re-send at half the grace period) ran
    # the INT trap inside the `read` of the next request; the trap's own
    # `read -t 0` reset that read's delimiter, so the next request was
    # swallowed and the cell never answered (or it was interrupted).
    k = bash()
    run(k, "v=kept")
    for i in range(3):
        signal_worker(k)
        time.sleep(0.2)  # let the trap run while the worker waits (not asserted)
        reply, iopub = run(k, f"echo fine-{i} $v", timeout=20)
        assert reply["content"]["status"] == "ok", (reply["content"], k.log_text())
        assert stream_text(iopub) == f"fine-{i} kept\n"


def test_interrupted_input_then_late_sigint(bash):
    # The reported failure: after an interrupted `read`, a SIGINT arriving
    # late must not touch the next cell.
    k = bash()
    msg_id = k.kc.execute("read -p 'never: ' v; echo not-reached", allow_stdin=True)
    assert k.kc.get_stdin_msg(timeout=10)["msg_type"] == "input_request"
    assert kutil.control_request(k, "interrupt_request")["content"]["status"] == "ok"
    r = k.collect(msg_id, 20)
    assert r["reply"]["content"]["ename"] == "KeyboardInterrupt"
    signal_worker(k)  # a duplicate, as the half-grace re-send would be
    for _ in range(3):
        reply, iopub = run(k, "echo fine", timeout=20)
        assert reply["content"]["status"] == "ok", (reply["content"], k.log_text())
        assert stream_text(iopub) == "fine\n"


def test_sigint_storm_never_desynchronises(bash):
    """SIGINTs at random moments (between cells, while a request is read,
    inside cells): every cell gets a reply, a cell either completes or is
    interrupted, and the shell and its state survive."""
    import random
    import threading
    k = bash()
    run(k, "v=kept")
    stop = threading.Event()

    def storm():
        while not stop.is_set():
            try:
                signal_worker(k)
            except (AssertionError, ProcessLookupError):
                pass
            stop.wait(random.random() * 0.01)

    t = threading.Thread(target=storm)
    t.start()
    try:
        for i in range(40):
            reply, iopub = run(k, f"echo c{i}", timeout=20)
            st = reply["content"]["status"]
            assert st in ("ok", "error"), reply["content"]
            if st == "ok":
                assert stream_text(iopub) == f"c{i}\n"
            else:
                assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
    finally:
        stop.set()
        t.join()
    reply, iopub = run(k, "echo $v")
    assert reply["content"]["status"] == "ok" and stream_text(iopub) == "kept\n"


def test_self_sent_sigint_interrupts(bash):
    # A SIGINT the kernel did not announce (sent by the cell itself) is a
    # real interrupt.
    k = bash()
    reply, iopub = run(k, "kill -INT $$; sleep 0.2; echo not-reached", timeout=20)
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert "not-reached" not in stream_text(iopub)
    reply, iopub = run(k, "echo fine")
    assert stream_text(iopub) == "fine\n"


# ---------------------------------------------------------------- introspection

def shell_request(k, send, timeout=10):
    msg_id = send()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = k.kc.get_shell_msg(timeout=timeout)
        if m["parent_header"].get("msg_id") == msg_id:
            return m
    raise TimeoutError


def test_complete(bash):
    k = bash()
    run(k, "my_long_variable=1; my_function_xyz() { :; }; mkdir -p somedir; touch somefile.txt")
    m = shell_request(k, lambda: k.kc.complete("ech", 3))
    assert m["content"]["status"] == "ok"
    assert "echo" in m["content"]["matches"]
    assert m["content"]["cursor_start"] == 0 and m["content"]["cursor_end"] == 3
    m = shell_request(k, lambda: k.kc.complete("x=1; my_func", 12))
    assert m["content"]["matches"] == ["my_function_xyz"]
    assert m["content"]["cursor_start"] == 5
    m = shell_request(k, lambda: k.kc.complete("echo $my_lo", 11))
    assert m["content"]["matches"] == ["$my_long_variable"]
    assert m["content"]["cursor_start"] == 5
    m = shell_request(k, lambda: k.kc.complete("cat some", 8))
    assert m["content"]["matches"] == ["somedir/", "somefile.txt"]
    assert m["content"]["cursor_start"] == 4
    # cursor in code points, not bytes
    m = shell_request(k, lambda: k.kc.complete("echo é; ech", 11))
    assert "echo" in m["content"]["matches"] and m["content"]["cursor_start"] == 8
    # the driver's internals are not offered
    m = shell_request(k, lambda: k.kc.complete("__km", 4))
    assert m["content"]["matches"] == []


IS_COMPLETE_CASES = [
    ("echo hi", "complete"),
    ("", "complete"),
    ("if true; then", "incomplete"),
    ("for i in 1 2; do echo $i", "incomplete"),
    ("echo 'open quote", "incomplete"),
    ('echo "open', "incomplete"),
    ("f() {", "incomplete"),
    ("echo a \\", "incomplete"),
    ("echo a |", "incomplete"),
    ("cat <<EOF\nabc", "incomplete"),
    ("fi", "invalid"),
    ("echo )", "invalid"),
]


def test_is_complete(bash):
    k = bash()
    got = {code: shell_request(k, lambda: k.kc.is_complete(code))["content"]["status"]
           for code, _ in IS_COMPLETE_CASES}
    assert got == dict(IS_COMPLETE_CASES)


def test_inspect(bash):
    k = bash()
    run(k, "myfn() { echo body-of-myfn; }; myvar=hello")
    m = shell_request(k, lambda: k.kc.inspect("myfn", 2))
    assert m["content"]["found"] is True
    assert "body-of-myfn" in m["content"]["data"]["text/plain"]
    m = shell_request(k, lambda: k.kc.inspect("cd /tmp", 1))
    assert "shell builtin" in m["content"]["data"]["text/plain"]
    assert "Change the shell working directory" in m["content"]["data"]["text/plain"]
    m = shell_request(k, lambda: k.kc.inspect("echo $myvar", 9))
    assert 'myvar="hello"' in m["content"]["data"]["text/plain"]
    m = shell_request(k, lambda: k.kc.inspect("no_such_thing_xyz", 3))
    assert m["content"]["found"] is False


def test_kernel_info(bash):
    import subprocess
    k = bash()
    k.kc.kernel_info()
    m = k.kc.get_shell_msg(timeout=10)
    c = m["content"]
    version = subprocess.run(["bash", "-c", "echo $BASH_VERSION"], capture_output=True,
                             text=True).stdout.strip()
    assert c["status"] == "ok"
    assert c["protocol_version"] == "5.3"
    assert c["implementation"] == "kernelmgr"
    assert c["language_info"]["name"] == "bash"
    assert c["language_info"]["version"] == version
    assert c["language_info"]["mimetype"] == "text/x-sh"
    assert c["language_info"]["file_extension"] == ".sh"
    assert version in c["banner"]
    assert isinstance(c["kernelmgr"]["sandbox"], list)


# ---------------------------------------------------------------- rich output

def make_png(path, w=3, h=2):
    def chunk(tag, data):
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * w for _ in range(h))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    path.write_bytes(png)
    return png


def test_display_png_and_svg(bash):
    k = bash()
    png = make_png(k.workspace / "plot.png")
    (k.workspace / "pic.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg">é</svg>')
    reply, iopub = run(k, "echo before; display plot.png; display pic.svg; echo after")
    assert reply["content"]["status"] == "ok"
    t = [x for x in types(iopub) if x != "status"]
    assert t == ["execute_input", "stream", "display_data", "display_data", "stream"]
    d = of_type(iopub, "display_data")
    assert base64.b64decode(d[0]["content"]["data"]["image/png"]) == png
    assert d[0]["content"]["data"]["text/plain"] == "plot.png"
    assert d[1]["content"]["data"]["image/svg+xml"] == \
        '<svg xmlns="http://www.w3.org/2000/svg">é</svg>'
    # from a subshell or a pipeline too, without disturbing the next cell
    reply, iopub = run(k, "(display plot.png); display pic.svg | cat; echo sub")
    assert len(of_type(iopub, "display_data")) == 2
    reply, iopub = run(k, "echo next")
    assert stream_text(iopub) == "next\n"
    reply, iopub = run(k, "display missing.png")
    assert reply["content"]["status"] == "error"
    assert "missing.png" in stream_text(iopub, "stderr")


# ---------------------------------------------------------------- output volume and bytes

def test_non_utf8_output(bash):
    k = bash()
    reply, iopub = run(k, r"printf 'a\xffb\n'; printf '\xc3'; sleep 0.2; printf '\xa9!\n'")
    assert reply["content"]["status"] == "ok"
    assert stream_text(iopub) == "a\ufffdb\né!\n"
    reply, iopub = run(k, r"printf 'tail\xe2\x82'")
    assert stream_text(iopub) == "tail\ufffd"


def test_50mb_output_with_responsive_kernel(bash):
    k = bash()
    msg_id = k.kc.execute("head -c 50000000 /dev/zero | tr '\\0' 'x'; echo; echo end")
    # while the flood runs, control and heartbeat answer
    info = kutil.control_request(k, "kernel_info_request", timeout=20)
    assert info is not None and info["msg_type"] == "kernel_info_reply"
    assert kutil.hb_ping(k, timeout=20)
    r = k.collect(msg_id, timeout=120)
    assert r["reply"]["content"]["status"] == "ok"
    streams = of_type(r["iopub"], "stream")
    text = "".join(m["content"]["text"] for m in streams)
    assert len(text) == 50_000_000 + len("\nend\n")
    assert text.endswith("x\nend\n") and text.count("x") == 50_000_000
    # coalesced: not a message per write, and bounded message size
    assert len(streams) < 5000
    assert max(len(m["content"]["text"]) for m in streams) <= 64 * 1024


@pytest.mark.skipif(SANDBOX != "strict", reason="memory limits need the strict sandbox")
def test_memory_limit_kill_is_reported(bash):
    k = bash("--memory", "64M")
    info = kutil.control_request(k, "kernel_info_request", timeout=20)
    protections = info["content"]["kernelmgr"]["sandbox"]
    reply, iopub = run(k, "x=$(head -c 200000000 /dev/zero | tr '\\0' x); echo ${#x}",
                       timeout=60)
    if "rlimit-data" in protections:
        # No memory cgroup for this caller (unprivileged on cgroup v1): the
        # limit is RLIMIT_DATA, so the allocation fails inside bash and
        # nothing is killed that could be attributed (sandbox.h). The limit
        # must still hold, and the kernel must still answer; when the
        # failed allocation ended the worker, the result names the limit.
        assert "200000000" not in stream_text(iopub), stream_text(iopub)
        if reply["content"].get("ename") == "KernelRestarted":
            assert "capped at 64 MiB here by RLIMIT_DATA" in reply["content"]["evalue"], reply
    else:
        assert any(p.endswith("-memory") for p in protections), protections
        assert reply["content"]["ename"] == "KernelRestarted"
        assert "out of memory (limit 64 MiB)" in reply["content"]["evalue"]
    reply, iopub = run(k, "echo alive")
    assert stream_text(iopub) == "alive\n"
