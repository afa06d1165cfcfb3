# kernelmgr — build, test, demo. See README.md.
#
#   make deps    install missing Debian packages (root; apt-get update first)
#   make         build/kernelmgr, build/kernelmgr-gateway, build/kernel-python, build/kernel-bash
#   make test    deps + build + every test, ends with one summary line
#   make check   fast tier: build, unit tests (no valgrind) and a smoke e2e (< 1 min)
#   make test-load  the e2e tiers of `make test` under a CPU hog (stress-ng, one per core)
#   make demo    deps + build + run examples/quickstart.md
#   make fuzz    libFuzzer targets, FUZZ_SECONDS each (default 60)
#   make bench   benchmarks against ipykernel (not a test)
#   make coverage  line coverage of each area by the unit tests alone (mk/coverage.mk)
#   make format / lint
#   make install / uninstall   PREFIX (/usr/local), DESTDIR, BINDIR, LIBEXECDIR,
#                DATADIR, MANDIR (docs/INSTALL.md); make deb: the Debian package

BUILD    ?= build
CC       ?= gcc
PKGS      = libzmq libsodium jansson libseccomp libwebsockets
CFLAGS   ?= -O2 -g
WARN      = -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wno-unused-parameter
ALL_CFLAGS = -std=gnu11 -D_GNU_SOURCE $(WARN) $(CPPFLAGS) $(CFLAGS) -I. -Iprotocol $(shell pkg-config --cflags $(PKGS))
LDLIBS    = $(shell pkg-config --libs $(PKGS)) -lpthread -lm
LINK      = $(CC) $(CFLAGS) $(LDFLAGS)

# Installation directories (GNU names). The binaries find their helpers and
# support files relative to themselves (common/cm_install.h): only the
# directories' positions relative to each other are compiled in, so DESTDIR
# and PREFIX may differ between `make` and `make install`.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBEXECDIR ?= $(PREFIX)/libexec
DATADIR    ?= $(PREFIX)/share
MANDIR     ?= $(DATADIR)/man
SYSCONFDIR ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
BASHCOMPDIR ?= $(DATADIR)/bash-completion/completions
INSTALL    ?= install
rel = $(shell realpath -m --relative-to='$(1)' '$(2)')
PATHS_DEF  = -DCM_REL_BIN_LIBEXEC='"$(call rel,$(BINDIR),$(LIBEXECDIR)/kernelmgr)"' \
  -DCM_REL_LIBEXEC_DATA='"$(call rel,$(LIBEXECDIR)/kernelmgr,$(DATADIR)/kernelmgr)"' \
  -DCM_REL_BIN_DATA='"$(call rel,$(BINDIR),$(DATADIR)/kernelmgr)"'
PATHS_STAMP = $(BUILD)/paths.stamp
# Extra install/uninstall steps other make fragments add (mk/*.mk).
INSTALL_EXTRA ?=
UNINSTALL_EXTRA ?=

# One static library per layer (every .c file but a directory's main.c), so
# binaries and unit tests link exactly the objects they use, and the link
# order (higher layers first) enforces the dependency direction: a lower
# layer that used a higher one's symbol would not link. The kernels do not
# link the manager at all.
LAYER_SRC = $(filter-out %/main.c $(GW_SRC),$(wildcard $(1)))
# The gateway (libwebsockets) and its stand-in are linked into the binaries
# directly: kernelmgr has gateway_none.c, kernelmgr-gateway has gateway.c and
# the files beside it that use lws (gw_int.h) (gateway.h, "Two binaries"), so `kernelmgr exec` never loads libwebsockets.
GW_LWS   := $(addprefix kernelmgr/frontends/,gateway.c gwhttp.c gwrest.c gwws.c)
GW_SRC   := $(GW_LWS) kernelmgr/frontends/gateway_none.c
LIB_SRC  := $(call LAYER_SRC,common/*.c sandbox/*.c protocol/*.c kernels/*/*.c kernelmgr/*/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
LIB_COMMON := $(BUILD)/libcommon.a
LIB_SBX    := $(BUILD)/libsandbox.a
LIB_PROTO  := $(BUILD)/libprotocol.a
LIB_KERN   := $(BUILD)/libkernels.a
LIB_MGR    := $(BUILD)/libkm.a
KERNEL_LIBS := $(LIB_KERN) $(LIB_PROTO) $(LIB_SBX) $(LIB_COMMON)
ALL_LIBS    := $(LIB_MGR) $(KERNEL_LIBS)
HEADERS  := $(wildcard common/*.h sandbox/*.h protocol/*.h kernels/*/*.h kernelmgr/*/*.h \
  kernelmgr/*/*.def)
BINS     := $(BUILD)/kernelmgr $(BUILD)/kernelmgr-gateway $(BUILD)/kernel-python $(BUILD)/kernel-bash \
            $(BUILD)/kernelmgr-sandbox
SHARE    := $(patsubst kernels/%,$(BUILD)/share/kernelmgr/%,$(wildcard kernels/python/*.py kernels/bash/*.sh))
# The Python driver precompiled (checked-hash .pyc in share/.../__pycache__,
# see PYKERNEL_BOOT in kernels/python/pykernel.h) for each interpreter in
# PYC_PYTHONS that exists: $(PYTHON) and the python3 on PATH by default.
PYC_STAMP := $(BUILD)/share/kernelmgr/python/__pycache__/.kernelmgr-pyc
PYC_PYTHONS ?= $(PYTHON) python3
UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/%)
PYTHON   ?= /usr/bin/python3

DEB_PACKAGES = build-essential pkg-config clang clang-format clang-tidy cppcheck valgrind strace \
  libzmq3-dev libsodium-dev libjansson-dev libseccomp-dev uthash-dev libcmocka-dev \
  libclang-rt-14-dev python3 python3-pytest python3-pytest-xdist stress-ng python3-jupyter-client jupyter-console \
  python3-nbclient python3-nbformat python3-nbconvert jupyter-nbconvert jupyter-client python3-ipykernel python3-debugpy python3-numpy python3-pandas \
  python3-matplotlib python3-venv python3-pip bubblewrap slirp4netns iproute2 util-linux procps \
  libwebsockets-dev python3-websocket python3-jupyter-server openssl \
  jupyter-notebook python3-notebook chromium chromium-driver python3-selenium python3-mypy \
  dpkg-dev debhelper lintian fakeroot python3-dill nginx python3-yaml

.PHONY: all deps test test-load check unit unit-bins e2e demo fuzz bench format lint clean \
  install uninstall deb container container-base FORCE
all: $(BINS) $(SHARE) $(PYC_STAMP)

# The relative installation paths, rewritten only when they change, so
# cm_install.o is rebuilt exactly then.
$(PATHS_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(PATHS_DEF)' | cmp -s - $@ || echo '$(PATHS_DEF)' >$@
$(BUILD)/obj/common/cm_install.o: ALL_CFLAGS += $(PATHS_DEF)
$(BUILD)/obj/common/cm_install.o: $(PATHS_STAMP)

$(BUILD)/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(LIB_COMMON): $(patsubst %.c,$(BUILD)/obj/%.o,$(call LAYER_SRC,common/*.c))
$(LIB_SBX): $(patsubst %.c,$(BUILD)/obj/%.o,$(call LAYER_SRC,sandbox/*.c))
$(LIB_PROTO): $(patsubst %.c,$(BUILD)/obj/%.o,$(call LAYER_SRC,protocol/*.c))
$(LIB_KERN): $(patsubst %.c,$(BUILD)/obj/%.o,$(call LAYER_SRC,kernels/*/*.c))
$(LIB_MGR): $(patsubst %.c,$(BUILD)/obj/%.o,$(call LAYER_SRC,kernelmgr/*/*.c))
$(ALL_LIBS):
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/kernelmgr: $(BUILD)/obj/kernelmgr/main.o $(BUILD)/obj/kernelmgr/frontends/gateway_none.o $(ALL_LIBS)
	$(LINK) -o $@ $^ -Wl,--as-needed $(LDLIBS)
$(BUILD)/kernelmgr-gateway: $(BUILD)/obj/kernelmgr/main.o $(GW_LWS:%.c=$(BUILD)/obj/%.o) $(ALL_LIBS)
	$(LINK) -o $@ $^ $(LDLIBS)
$(BUILD)/kernel-python: $(BUILD)/obj/kernels/python/main.o $(KERNEL_LIBS)
	$(LINK) -o $@ $^ $(LDLIBS)
$(BUILD)/kernel-bash: $(BUILD)/obj/kernels/bash/main.o $(KERNEL_LIBS)
	$(LINK) -o $@ $^ $(LDLIBS)
$(BUILD)/kernelmgr-sandbox: $(BUILD)/obj/kernels/sandbox/main.o $(KERNEL_LIBS)
	$(LINK) -o $@ $^ $(LDLIBS)

$(BUILD)/share/kernelmgr/%: kernels/%
	@mkdir -p $(dir $@)
	cp $< $@

# -I: no PYTHONPYCACHEPREFIX or other PYTHON* settings of the builder. Not
# an error when an interpreter is missing: the driver then compiles at start.
# kipython.py too: with the `ipython` option on a worker loads it at start (checked-hash
# .pyc, validated against the source by the import system).
$(PYC_STAMP): $(BUILD)/share/kernelmgr/python/driver.py $(BUILD)/share/kernelmgr/python/kipython.py
	@mkdir -p $(dir $@)
	@for py in $(PYC_PYTHONS); do command -v $$py >/dev/null 2>&1 || continue; \
	  $$py -I -c 'import py_compile as p, sys; [p.compile(f, optimize=o, doraise=True, \
	    invalidation_mode=p.PycInvalidationMode.CHECKED_HASH) for f in sys.argv[1:] \
	    for o in (0, 1, 2)]' $^ || \
	  echo "note: $$py could not precompile $^ (they compile at start)"; done
	@touch $@

# Unit tests that need a kernel but not Python or Bash link the fake one
# (tests/unit/fake_kernel.h).
FAKE_KERNEL_TESTS := test_kserver_fake test_km_session_locks test_km_dmethods test_cli test_km_slot_start \
  test_mcp test_gateway
$(FAKE_KERNEL_TESTS:%=$(BUILD)/tests/%): $(BUILD)/obj/tests/unit/fake_kernel.o
# ... and a manager on a fresh home whose languages it backs (fake_manager.h).
FAKE_MANAGER_TESTS := test_km_session_locks test_km_dmethods test_km_slot_start
$(FAKE_MANAGER_TESTS:%=$(BUILD)/tests/%): $(BUILD)/obj/tests/unit/fake_manager.o
# The CLI's and MCP's tests link what the kernelmgr binary does (the gateway's
# stand-in) and run it in a child (cli_child.h).
$(BUILD)/tests/test_cli $(BUILD)/tests/test_mcp: $(BUILD)/obj/kernelmgr/frontends/gateway_none.o \
  $(BUILD)/obj/tests/unit/cli_child.o $(BUILD)/obj/tests/unit/fake_daemon.o
# The gateway's test links the gateway itself (the lws files, as
# kernelmgr-gateway does).
$(BUILD)/tests/test_gateway: $(GW_LWS:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/tests/unit/cli_child.o \
  $(BUILD)/obj/tests/unit/fake_daemon.o
$(BUILD)/tests/%: tests/unit/%.c $(ALL_LIBS) $(HEADERS) $(wildcard tests/unit/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(filter %.o,$^) $(ALL_LIBS) -lcmocka $(LDLIBS)

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing" $$missing; \
	  if [ "$$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi; \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null || \
	  { echo "deps: apt-get install failed" >&2; exit 1; }; \
	fi
	@tests/npm-deps.sh

unit: all $(UNIT_BIN)
unit-bins: $(UNIT_BIN)
test: deps
	@$(MAKE) --no-print-directory all $(UNIT_BIN)
	@PYTHON=$(PYTHON) BUILD=$(BUILD) tests/run.sh

# The e2e tiers with every core kept busy by stress-ng: what a loaded CI
# machine does to the tests' timing (not part of `make test`: it takes about
# twice as long). KM_TEST_TIERS picks other tiers.
test-load: deps
	@$(MAKE) --no-print-directory all $(UNIT_BIN)
	@stress-ng --cpu $$(nproc) --quiet --timeout 4h & hog=$$!; \
	  PYTHON=$(PYTHON) BUILD=$(BUILD) KM_TEST_TIERS="$${KM_TEST_TIERS:-e2e sanitized}" \
	    tests/run.sh; rc=$$?; kill $$hog; wait $$hog 2>/dev/null; exit $$rc

# The fast tier while developing; `make test` is what CI runs.
SMOKE = tests/e2e/test_protocol_interop.py tests/e2e/test_kernel_start.py tests/e2e/test_mgr_oneshot.py
check: all $(UNIT_BIN)
	@for t in $(UNIT_BIN); do $$t >$(BUILD)/$$(basename $$t).check.log 2>&1 || \
	    { echo "check: $$t FAILED (log: $(BUILD)/$$(basename $$t).check.log)"; exit 1; }; done
	@echo "check: unit tests passed"
	@BUILD=$(BUILD) KM_TEST_SANDBOX=$${KM_TEST_SANDBOX:-strict} $(PYTHON) -m pytest -q -p no:cacheprovider $(SMOKE)

demo: deps
	@$(MAKE) --no-print-directory all
	@examples/demo.sh

fuzz: deps
	@$(MAKE) --no-print-directory $(FUZZ_BIN)
	@BUILD=$(BUILD) FUZZ_SECONDS=$${FUZZ_SECONDS:-60} tests/fuzz/run.sh

$(BUILD)/fuzz/%: tests/fuzz/%.c $(wildcard common/*.c protocol/*.c) $(HEADERS)
	@mkdir -p $(dir $@)
	clang -std=gnu11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -I. -Iprotocol \
	  $(shell pkg-config --cflags $(PKGS)) -o $@ $< $(wildcard common/*.c protocol/*.c) $(LDLIBS)

bench: deps
	@$(MAKE) --no-print-directory all
	@$(PYTHON) tests/bench/bench.py

FMT_FILES = $(wildcard common/*.[ch] sandbox/*.[ch] protocol/*.[ch] kernels/*/*.[ch] kernelmgr/*.c kernelmgr/*/*.[ch] tests/unit/*.c tests/fuzz/*.c)
format:
	clang-format -i $(FMT_FILES)
lint:
	tests/tools/layers.sh
	clang-format --dry-run --Werror $(FMT_FILES)
	cppcheck --quiet --error-exitcode=1 --enable=warning,portability --inline-suppr \
	  --suppress=missingIncludeSystem -I protocol -I . $(FMT_FILES)
	$(PYTHON) -m mypy --strict --no-error-summary --cache-dir $(BUILD)/mypy \
	  clients/python/src/kernelmgr clients/python/_build/kmbuild.py

clean:
	rm -rf $(BUILD)

# Other fragments first: they append to INSTALL_EXTRA / UNINSTALL_EXTRA,
# which install.mk's rules name as prerequisites (expanded when read).
-include $(filter-out mk/install.mk,$(wildcard mk/*.mk))
include mk/install.mk
