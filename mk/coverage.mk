# make coverage — the share of each area's lines the unit tests alone
# execute (no e2e). Included from the Makefile; not part of `make test` or
# `make check`.
#
# The unit tests and every object of the areas are built again by this
# Makefile with CFLAGS="--coverage -O0" in a build directory of their own,
# $(BUILD)/cov (the variant mechanism of tests/run.sh's asan build: the same
# rules, another BUILD), so no object of the normal build is touched. Every
# object of the areas is built, those no unit test links included (the
# binaries' main.c, the gateway's lws files): their lines count as not
# executed instead of not counted. A process that ends in _exit() (the
# forked children of the tests, the sandbox and the kernel server) writes
# its counters first (tests/tools/cov_exit.c). The counters (.gcda) of an
# earlier run are deleted first, so a run counts only itself; then every
# unit test binary runs, one per core at a time (libgcov merges the counts
# of processes writing the same .gcda under a lock), and
# tests/tools/coverage.py reads gcov's JSON and prints one line per area. A
# unit test that fails fails the target, after the table.

ifndef COVERAGE_MK_INCLUDED
COVERAGE_MK_INCLUDED := 1
# KLIB_OBJ (the C client library's objects; test_klib links them)
include mk/libkernelmgr.mk

COV_BUILD  := $(BUILD)/cov
# -fprofile-update=atomic: the daemon's and kernel server's threads update
# the counters without losing counts
COV_CFLAGS := --coverage -O0 -g -fprofile-update=atomic
# The areas, in the order of the table (directory prefixes; the first that
# matches a file takes it): tests/tools/coverage.py --area.
COV_AREAS  := kernelmgr/engine kernelmgr/service kernelmgr/frontends kernelmgr/packages \
  kernelmgr/main.c kernels/server kernels/egress kernels/python kernels/bash kernels/sandbox \
  sandbox protocol common libkernelmgr
COV_SRC    := $(wildcard common/*.c sandbox/*.c protocol/*.c kernels/*/*.c kernelmgr/*.c \
  kernelmgr/*/*.c)

# A process ending in _exit() writes its counters too (tests/tools/cov_exit.c);
# the unit tests link it (their rules pass LDFLAGS to the link).
COV_EXIT    := $(COV_BUILD)/obj/tests/tools/cov_exit.o
COV_LDFLAGS := -Wl,--wrap=_exit,--wrap=_Exit $(abspath $(COV_EXIT))
# one job per core unless make was given -j (its jobserver is shared then)
COV_JOBS    = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$$(nproc))

FMT_FILES += tests/tools/cov_exit.c

.PHONY: coverage cov-objs
# (inside the variant build) every object of the areas
cov-objs: $(COV_SRC:%.c=$(BUILD)/obj/%.o) $(KLIB_OBJ)

coverage:
	@$(MAKE) --no-print-directory BUILD=$(COV_BUILD) CFLAGS='$(COV_CFLAGS)' $(COV_EXIT)
	@$(MAKE) --no-print-directory $(COV_JOBS) BUILD=$(COV_BUILD) CFLAGS='$(COV_CFLAGS)' \
	  LDFLAGS='$(COV_LDFLAGS)' unit-bins cov-objs
	@find $(COV_BUILD) -name '*.gcda' -delete
	@mkdir -p $(COV_BUILD)/logs && rm -f $(COV_BUILD)/logs/*
	@for t in $(COV_BUILD)/tests/test_*; do [ -x "$$t" ] && echo "$$t"; done | \
	  xargs -r -P "$$(nproc)" -n 1 sh -c 'log=$(COV_BUILD)/logs/$$(basename "$$0").log; \
	    "$$0" >"$$log" 2>&1 || echo "coverage: $$0 FAILED (log: $$log)" >>$(COV_BUILD)/logs/failed'
	@$(PYTHON) tests/tools/coverage.py --build $(COV_BUILD) $(COV_AREAS:%=--area %)
	@if [ -s $(COV_BUILD)/logs/failed ]; then cat $(COV_BUILD)/logs/failed; exit 1; fi

endif
