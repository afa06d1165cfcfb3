"""kernelmgr's IPython path: every cell through IPython's InteractiveShell.

Loaded by driver.py (by path, beside it, never from the workspace) when
IPython is importable in the kernel's interpreter; without IPython the
driver's stdlib-only path runs cells (docs/KERNELS.md). This module owns the
shell: a subclass of InteractiveShell made the way ipykernel 6.17 makes its
ZMQInteractiveShell (ipykernel/zmqshell.py, displayhook.py, compiler.py,
ipkernel.py's do_execute), with the Jupyter messages replaced by the
driver's worker-protocol events (kernels/WORKER_PROTOCOL.md):

  * the displayhook sends execute_result, the display publisher
    display_data / update_display_data / clear_output (driver._publish,
    driver._emit), tracebacks are IPython's structured ones in `error`;
  * the payload manager collects page (`obj?`), set_next_input and ask_exit
    payloads for the cell's `done`;
  * history (In, Out, _i, _ii, _iii, _iN) is IPython's, in memory only;
  * cells compile under the name the Jupyter debugger computes (Murmur2 of
    the raw cell, as ipykernel's XCachingCompiler), registered in linecache,
    so that tracebacks say "Cell In[N], line L" and a breakpoint set later
    in a function of an earlier cell binds;
  * `!cmd` / `%sx` run through IPython's system_piped (pexpect on a pty, as
    ipykernel) when a pty can be opened, else system_raw;
  * ipykernel's KernelMagics (%clear, %less, %more, %man, %autosave,
    %connect_info, %edit's payload), matplotlib_inline as the default
    backend, `%debug` / `%pdb` / breakpoint() over the stdin channel (the
    driver's input()).

Parts are adapted from ipykernel (BSD-3-Clause, Copyright (c) IPython
Development Team). The driver passes itself as `drv`; nothing here reads the
request pipe or writes the event pipe except through it.
"""

import os
import sys

_EXIT_WARNING = r"To exit: use 'exit', 'quit', or Ctrl-D\."
_drv = None  # the driver module
_shell = None  # the one KShell


def _encode(data):
    """A MIME bundle as JSON can carry it (ipykernel's encode_images and
    json_clean): binary images base64, bytes of text decoded."""
    out = {}
    for mime, value in (data or {}).items():
        value = _drv._encode_mime(mime, value)
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("utf-8", "replace")
        out[mime] = value
    return out


def _classes():
    """The shell's classes, defined once IPython is imported."""
    from IPython.core import page, payloadpage
    from IPython.core.autocall import ZMQExitAutocall
    from IPython.core.compilerop import CachingCompiler
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.error import UsageError
    from IPython.core.history import HistoryManager
    from IPython.core.interactiveshell import InteractiveShell, InteractiveShellABC
    from IPython.core.magic import Magics, line_magic, magics_class
    from IPython.core.magics import CodeMagics, MacroToEdit
    from IPython.utils import openpy
    from traitlets import Any, CBool, Instance, Type, default

    class KCompiler(CachingCompiler):
        """ipykernel's XCachingCompiler: a cell's file name is the one the
        Jupyter debugger computes from its raw code."""

        def get_code_name(self, raw_code, code, number):
            # the driver's name (one Murmur2, one tmpFilePrefix), noted as
            # cell `number` so that kdebug serves its `source` before a
            # debugger attached
            return _drv._cell_filename(int(number), raw_code)

    class KHistory(HistoryManager):
        """IPython's history in memory only: no database, no saving thread,
        and the write-out caches (unused without a database) kept empty."""

        def store_inputs(self, line_num, source, source_raw=None):
            super().store_inputs(line_num, source, source_raw)
            self.db_input_cache[:] = []

        def store_output(self, line_num):
            super().store_output(line_num)
            self.db_output_cache[:] = []

    class KDisplayHook(DisplayHook):
        """ipykernel's ZMQShellDisplayHook: the result as execute_result."""

        msg = None

        def start_displayhook(self):
            self.msg = {"data": {}, "metadata": {}}

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            self.msg["data"] = _encode(format_dict)
            self.msg["metadata"] = md_dict or {}

        def finish_displayhook(self):
            msg, self.msg = self.msg, None
            if msg and msg["data"]:
                _drv._emit({"type": "execute_result", "data": msg["data"],
                            "metadata": msg["metadata"]})

    class KDisplayPublisher(DisplayPublisher):
        """ipykernel's ZMQDisplayPublisher, with its per-thread hooks (a hook
        gets {"msg_type", "content"} and returns it, changed, or None when it
        took the message)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            import threading

            self._local = threading.local()

        @property
        def _hooks(self):
            if not hasattr(self._local, "hooks"):
                self._local.hooks = []
            return self._local.hooks

        def publish(self, data, metadata=None, source=None, *, transient=None, update=False,
                    **kwargs):
            self._validate_data(data, metadata)
            msg = {"msg_type": "update_display_data" if update else "display_data",
                   "content": {"data": _encode(data), "metadata": metadata or {},
                               "transient": transient or {}}}
            for hook in list(self._hooks):
                msg = hook(msg)
                if msg is None:
                    return
            c = msg["content"]
            _drv._publish(c["data"], c.get("metadata"), c.get("transient"),
                          msg["msg_type"] == "update_display_data")

        def clear_output(self, wait=False):
            _drv._emit({"type": "clear_output", "wait": bool(wait)})

        def register_hook(self, hook):
            self._hooks.append(hook)

        def unregister_hook(self, hook):
            try:
                self._hooks.remove(hook)
                return True
            except ValueError:
                return False

    @magics_class
    class KernelMagics(Magics):
        """ipykernel's KernelMagics, for this kernel."""

        _find_edit_target = CodeMagics._find_edit_target

        @line_magic
        def edit(self, parameter_s="", last_call=None):
            """Ask the frontend to open a file in its editor (an edit_magic
            payload, as ipykernel); nothing runs here."""
            last_call = last_call or ["", ""]
            opts, args = self.parse_options(parameter_s, "prn:")
            try:
                filename, lineno, _ = CodeMagics._find_edit_target(self.shell, args, opts,
                                                                    last_call)
            except MacroToEdit:
                print("Macro editing not yet implemented in 2-process model.")
                return
            filename = os.path.abspath(filename)
            self.shell.payload_manager.write_payload(
                {"source": "edit_magic", "filename": filename, "line_number": lineno})

        @line_magic
        def clear(self, arg_s):
            """Clear the terminal."""
            self.shell.system("clear")

        @line_magic
        def less(self, arg_s):
            """Show a file through the pager.

            Files ending in .py are syntax-highlighted."""
            if not arg_s:
                raise UsageError("Missing filename.")
            if arg_s.endswith(".py"):
                cont = self.shell.pycolorize(openpy.read_py_file(arg_s,
                                                                 skip_encoding_cookie=False))
            else:
                with open(arg_s) as f:
                    cont = f.read()
            page.page(cont)

        more = line_magic("more")(less)

        @line_magic
        def man(self, arg_s):
            """Find the man page for the given command and display in pager."""
            page.page(self.shell.getoutput("man %s | col -b" % arg_s, split=False))

        @line_magic
        def connect_info(self, arg_s):
            """Print information for connecting other clients to this kernel.

            A kernelmgr kernel has no connection file of its own: clients
            connect through kernelmgr (its gateway or API), which says how."""
            print("This kernel runs under kernelmgr, in a sandbox: it has no connection file.\n"
                  "Connect other clients through kernelmgr (`kernelmgr --help`; the gateway\n"
                  "serves Jupyter's kernel WebSocket protocol).")

        @line_magic
        def qtconsole(self, arg_s):
            """Open a qtconsole connected to this kernel (not available: the
            kernel runs in a sandbox without a display)."""
            import warnings

            warnings.warn("Could not start qtconsole: this kernel runs in a sandbox")

        @line_magic
        def autosave(self, arg_s):
            """Set the autosave interval in the notebook (in seconds).

            The default value is 120, or two minutes.
            ``%autosave 0`` will disable autosave.

            This magic only has an effect when called from the notebook interface.
            It has no effect when called in a startup file.
            """
            from IPython.display import Javascript, display

            try:
                interval = int(arg_s)
            except ValueError as e:
                raise UsageError("%%autosave requires an integer, got %r" % arg_s) from e
            display(Javascript("IPython.notebook.set_autosave_interval(%i)" % (1000 * interval)),
                    include=["application/javascript"])
            if interval:
                print("Autosaving every %i seconds" % interval)
            else:
                print("Autosave disabled")

    class KShell(InteractiveShell):
        """ipykernel's ZMQInteractiveShell over the worker protocol."""

        displayhook_class = Type(KDisplayHook)
        display_pub_class = Type(KDisplayPublisher)
        compiler_class = Type(KCompiler)
        data_pub_class = Any()
        kernel = Any()
        parent_header = Any()
        readline_use = CBool(False)
        autoindent = CBool(False)
        exiter = Instance(ZMQExitAutocall)
        keepkernel_on_exit = None
        _last_traceback = None
        _exit_filter = None  # the warnings filter a sys.exit(0) of this cell added

        @default("exiter")
        def _default_exiter(self):
            return ZMQExitAutocall(self)

        @default("banner1")
        def _default_banner1(self):
            from IPython.core.usage import default_banner

            return default_banner

        def init_history(self):
            self.history_manager = KHistory(shell=self, parent=self, enabled=False)
            self.configurables.append(self.history_manager)

        def enable_gui(self, gui=None):
            # There is no GUI event loop in a sandboxed kernel: figures are
            # inline (matplotlib_inline), as ipykernel's "inline" loop.
            if gui not in (None, "inline"):
                raise UsageError("GUI event loop %r is not available in this kernel (it runs "
                                 "in a sandbox without a display); use %%matplotlib inline"
                                 % (gui,))
            self.active_eventloop = gui

        def init_environment(self):
            env = os.environ
            env["TERM"] = "xterm-color"
            env["CLICOLOR"] = "1"
            env["PAGER"] = "cat"
            env["GIT_PAGER"] = "cat"

        def init_hooks(self):
            super().init_hooks()
            self.set_hook("show_in_pager", page.as_hook(payloadpage.page), 99)

        def init_data_pub(self):
            pass

        def init_virtualenv(self):
            pass

        def init_magics(self):
            super().init_magics()
            self.register_magics(KernelMagics)
            self.magics_manager.register_alias("ed", "edit")

        def ask_exit(self):
            self.exit_now = not self.keepkernel_on_exit
            self.payload_manager.write_payload(
                {"source": "ask_exit", "keepkernel": self.keepkernel_on_exit})

        def run_cell(self, *args, **kwargs):
            self._last_traceback = None
            return super().run_cell(*args, **kwargs)

        def showtraceback(self, exc_tuple=None, filename=None, tb_offset=None,
                          exception_only=False, running_compiled_code=False):
            # sys.exit(0) / sys.exit() ends a cell successfully and silently
            # in this kernel (its exit status is the cell's exit_code).
            try:
                etype, value, tb = self._get_exc_info(exc_tuple)
            except ValueError:
                etype = value = tb = None
            if etype is SystemExit and value.code in (None, 0):
                # and without IPython's "To exit: use 'exit'..." warning, which
                # run_code gives next (the filter goes when the cell ends)
                import warnings

                warnings.filterwarnings("ignore", message=_EXIT_WARNING, category=UserWarning)
                self._exit_filter = warnings.filters[0]
                return
            if tb is not None:
                tb = _without_kernel_frames(tb)
                value.__traceback__ = sys.last_traceback = tb
                exc_tuple = (etype, value, tb)
            return super().showtraceback(exc_tuple, filename, tb_offset, exception_only,
                                         running_compiled_code)

        def _showtraceback(self, etype, evalue, stb):
            if os.getpid() != _drv._S.main_pid:
                return  # a child the cell forked (no exec) never reports for it
            try:
                evalue_s = str(evalue)
            except Exception:
                evalue_s = "<str() failed>"
            _drv._emit({"type": "error", "ename": str(getattr(etype, "__name__", etype)),
                        "evalue": evalue_s, "traceback": list(stb)})
            self._last_traceback = stb

        def set_next_input(self, text, replace=False):
            self.payload_manager.write_payload(
                {"source": "set_next_input", "text": text, "replace": replace})

        def system_piped(self, cmd):
            """ipykernel's: `!cmd` on a pty through pexpect (CRLF line ends,
            `ls` in columns), its status in _exit_code; without a pty
            (pexpect missing, no /dev/ptmx) IPython's system_raw."""
            if cmd.rstrip().endswith("&"):
                raise OSError("Background processes not supported.")
            if not _have_pty():
                return self.system_raw(cmd)
            from IPython.utils.process import system

            self.user_ns["_exit_code"] = system(self.var_expand(cmd, depth=1))

        system = system_piped

    InteractiveShellABC.register(KShell)
    for cls in (KCompiler, KHistory, KDisplayHook, KDisplayPublisher, KernelMagics, KShell):
        cls.__module__ = "kernelmgr"
        cls.__qualname__ = cls.__name__
    return KShell


def _without_kernel_frames(tb):
    """tb without the frames of the kernel's own files (the driver's SIGINT
    handler that raised KeyboardInterrupt, kernelmgr's debugger glue): none
    of them shows in a traceback, as in ipykernel, whose handler is C."""
    own = {os.path.abspath(_drv._DRIVER_FILE), os.path.abspath(__file__)}
    kept = []
    t = tb
    while t is not None:
        f = t.tb_frame.f_code.co_filename
        dbg = _drv._DBG.mod
        if f not in own and not (dbg is not None and dbg.is_debugger_file(f)):
            kept.append(t)
        t = t.tb_next
    if not kept:
        return tb
    for a, b in zip(kept, kept[1:] + [None]):
        a.tb_next = b
    return kept[0]


_PTY = []


def _have_pty():
    if not _PTY:
        ok = False
        try:
            import pexpect  # noqa: F401

            master, slave = os.openpty()
            os.close(master)
            os.close(slave)
            ok = True
        except Exception:
            pass
        _PTY.append(ok)
    return _PTY[0]


_EMBED = "IPython.terminal.embed"


class _LazyEmbed(type(sys)):
    """IPython.terminal.embed until something other than IPython's own
    __init__ uses it: that import (IPython.embed, the terminal shell and
    prompt_toolkit) is a third of IPython's import time and no kernel needs
    it (ipykernel loads it all the same). The first attribute asked of it
    loads the real module, which replaces this one."""

    def __getattr__(self, name):
        if name.startswith("__"):  # the import system's probes (__path__, ...)
            raise AttributeError(name)
        return getattr(_real_embed(), name)


def _real_embed():
    mod = sys.modules.get(_EMBED)
    if isinstance(mod, _LazyEmbed):
        del sys.modules[_EMBED]
        import importlib

        mod = importlib.import_module(_EMBED)
        term = sys.modules.get("IPython.terminal")
        if term is not None:
            term.embed = mod
    return mod


def _embed(*args, **kwargs):
    return _real_embed().embed(*args, **kwargs)


def _defer_terminal():
    if "IPython" in sys.modules or _EMBED in sys.modules:
        return
    stub = _LazyEmbed(_EMBED)
    stub.embed = _embed
    _embed.__name__ = _embed.__qualname__ = "embed"
    _embed.__module__ = _EMBED
    _embed.__doc__ = "Call this to embed IPython at the current point in your program."
    sys.modules[_EMBED] = stub


def preload(drv):
    """Imports IPython and what a cell needs first (nothing that depends on
    the kernel: safe before a fork). Raises ImportError without IPython."""
    global _drv
    _drv = drv
    _defer_terminal()
    for name in ("IPython.core.interactiveshell", "IPython.core.payloadpage",
                 "IPython.core.autocall", "IPython.core.magics", "IPython.utils.process",
                 "IPython.core.completer", "IPython.core.debugger", "traitlets"):
        drv._ipython_import(name)
    return _classes()


def premake(drv, shell_class):
    """In a zygote, before any fork: the shell made as make_shell would make
    it, less what belongs to a worker, which finish() redoes in each one
    (its environment, home and IPython directory, cwd, stdio, builtins).
    Returns (shell, its user module: the worker's __main__ to be), or None
    when it could not be made (the worker then makes its own).

    What runs here is IPython's own InteractiveShell construction and this
    module's: no configuration file, profile startup file or extension
    (those are an IPython application's, never loaded here), no thread (the
    history is KHistory, disabled: no database, no saving thread), no file
    left open. The profile directory it wants is a private temporary one,
    removed at once; the zygote's __main__, builtins and environment are
    put back as they were."""
    global _drv
    _drv = drv
    import builtins
    import shutil
    import tempfile
    import types
    import warnings

    saved_env = dict(os.environ)
    saved_main = sys.modules.get("__main__")
    saved_b = {k: builtins.__dict__[k] for k in _BUILTINS if k in builtins.__dict__}
    tmp = None
    try:
        tmp = tempfile.mkdtemp(prefix="kernelmgr-zygote-ipython-")
        os.environ["IPYTHONDIR"] = tmp
        main = types.ModuleType("__main__")
        main.__builtins__ = builtins
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            shell = shell_class.instance(user_module=main)
        return shell, main
    except Exception:
        try:
            shell_class.clear_instance()
        except Exception:
            pass
        return None
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        for k in _BUILTINS:
            builtins.__dict__.pop(k, None)
        builtins.__dict__.update(saved_b)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


_BUILTINS = ("__IPYTHON__", "display")  # what InteractiveShell.init_builtins sets


def finish(drv, shell):
    """In the worker, after the driver's _setup made premake's module its
    __main__: what make_shell's construction took from the worker, done
    again here (InteractiveShell's init_* steps that read the environment,
    the cwd, stdio or builtins), then make_shell's own last steps."""
    import pathlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _rewire(shell)
    return _made(drv, shell)


def _rewire(shell):
    import pathlib

    shell.init_ipython_dir(None)  # IPYTHONDIR / HOME: the worker's
    shell.init_profile_dir(None)
    shell.db = type(shell.db)(os.path.join(shell.profile_dir.location, "db"))
    shell.starting_dir = os.getcwd()
    shell.init_environment()
    shell.save_sys_module_state()  # the worker's stdio
    shell.init_sys_modules()
    shell.init_encoding()
    shell.init_pushd_popd_magic()  # home_dir
    shell.init_logger()
    hm = shell.history_manager
    hm.hist_file = hm._get_hist_file_name()
    hm.dir_hist[:] = [pathlib.Path.cwd()]
    shell.init_user_ns()  # In, Out, _ih, _oh over the driver's own
    shell.init_builtins()  # IPython's display over the driver's
    shell.sys_excepthook = sys.excepthook


def make_shell(drv, shell_class, main):
    """The one shell, its user namespace the driver's __main__ (call after
    the driver's _setup, in the worker)."""
    global _drv
    _drv = drv
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shell = shell_class.instance(user_module=main)
    return _made(drv, shell)


def _made(drv, shell):
    global _shell
    shell.kernel = None
    _shell = shell
    if drv._findable("matplotlib_inline"):
        # ipykernel's default backend (kernelapp.init_gui_pylab).
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    return shell


def execute(code, silent, store_history, count, exprs):
    """One execute request as ipykernel's do_execute runs it: (status,
    exit_code, user_expressions or None, payload list)."""
    shell = _shell
    if store_history and not silent:
        shell.execution_count = count
        hm = shell.history_manager
        for hist in (hm.input_hist_parsed, hm.input_hist_raw):
            while len(hist) < count:
                hist.append("")
            del hist[count:]
    res = None
    err = None
    if _drv._DBG.mod is not None:
        _drv._DBG.mod.cell_starts()  # traced while a debugger client is attached
    try:
        _drv._S.user = True
        try:
            res = shell.run_cell(code, store_history=store_history, silent=silent)
        finally:
            _drv._S.user = False
    except BaseException as e:  # an interrupt outside the cell's own code
        err = e
        if isinstance(e, SystemExit):
            raise
        shell.showtraceback()
    finally:
        f, shell._exit_filter = shell._exit_filter, None
        if f is not None:
            import warnings

            try:
                warnings.filters.remove(f)
                warnings._filters_mutated()
            except (ValueError, AttributeError):
                pass
    if res is not None:
        err = res.error_before_exec if res.error_before_exec is not None else res.error_in_exec
    status, exit_code = ("ok", 0) if err is None else ("error", 1)
    if isinstance(err, SystemExit):
        c = err.code
        if c in (None, 0):
            status, exit_code = "ok", 0
        else:
            exit_code = c if isinstance(c, int) else 1
    elif err is not None:
        rc = getattr(err, "returncode", None)  # %%bash's CalledProcessError: the script's
        if type(err).__name__ == "CalledProcessError" and isinstance(rc, int) and rc:
            exit_code = rc if rc > 0 else 128 - rc
        if _drv._DBG.mod is not None and isinstance(err, KeyboardInterrupt):
            _drv._DBG.mod.after_interrupt()
    ue = None
    if exprs:
        ue = shell.user_expressions(exprs) if status == "ok" else {}
    payload = shell.payload_manager.read_payload()
    shell.payload_manager.clear_payload()
    return status, exit_code, ue, payload


def exit_requested():
    return _shell is not None and bool(_shell.exit_now)


def inspect(code, cursor, detail):
    """ipykernel's do_inspect: (found, data, metadata)."""
    from IPython.utils.tokenutil import token_at_cursor

    name = token_at_cursor(code, cursor)
    try:
        bundle = _shell.object_inspect_mime(name, detail_level=detail)
        if not _shell.enable_html_pager:
            bundle.pop("text/html", None)
        return True, bundle, {}
    except KeyError:
        return False, {}, {}


def is_complete(code):
    status, indent = _shell.input_transformer_manager.check_complete(code)
    ev = {"type": "is_complete_reply", "status": status}
    if status == "incomplete":
        ev["indent"] = " " * (indent or 0)
    return ev
